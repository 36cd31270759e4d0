"""Thinking budgets: after N reasoning tokens the worker closes the block and the answer follows.

The tiny model's template opens <think> in the generation prompt, so its output starts inside
reasoning and, with random weights, never closes the block by itself. The oracle is mlx-lm's
own greedy generation in this process: the first N reasoning tokens, then the template's end
marker, then what mlx-lm generates after it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import mlx.core as mx
import mlx_lm
import openai
import pytest
from mlx_lm.generate import generate_step

from mlxd.shared.params import GenerationParams
from mlxd.worker.chat.think_budget import ThinkBudget, think_budget

from procs import start_worker, stop, uds_openai
from tiny_model import OPEN_THINK_TEMPLATE, build_tiny_model

MSG = [{"role": "user", "content": "Where is the Eiffel tower?"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("budget"), chat_template=OPEN_THINK_TEMPLATE)


@pytest.fixture(scope="module")
def oai(model_dir, short_tmp):
    sock = short_tmp / "budget.sock"
    proc = start_worker(model_dir, sock, "tiny", "--no-ssd-cache", log=short_tmp / "budget.log")
    yield uds_openai(sock)
    stop(proc)


@pytest.fixture(scope="module")
def ref(model_dir):
    return mlx_lm.load(str(model_dir))


def greedy(ref, ids: list[int], n: int) -> list[int]:
    model, tok = ref
    out: list[int] = []
    for token, _ in generate_step(mx.array(ids), model, max_tokens=n):
        out.append(int(token))
        if out[-1] in tok.eos_token_ids:
            break
    return out


def expected(ref, budget: int, max_tokens: int, **kwargs) -> tuple[str, str]:
    """mlx-lm's reasoning cut after `budget` tokens, and its answer after the end marker."""
    _, tok = ref
    text = tok.apply_chat_template(MSG, add_generation_prompt=True, tokenize=False, **kwargs)
    ids = tok.encode(text, add_special_tokens=False)
    thought = greedy(ref, ids, budget) if budget else []
    end = list(tok.think_end_tokens)
    assert not set(end) & set(greedy(ref, ids, max_tokens))  # never closes by itself
    answer = greedy(ref, ids + thought + end, max_tokens - budget - len(end))
    return tok.decode(thought).strip(), tok.decode(answer).strip()


def ask(oai, **kw):
    return oai.chat.completions.create(model="tiny", messages=MSG, temperature=0, **kw)


def test_budget_closes_the_reasoning_and_the_answer_follows(oai, ref):
    want_reasoning, want_answer = expected(ref, 6, 24)
    assert want_reasoning and want_answer
    r = ask(oai, max_tokens=24, extra_body={"thinking_token_budget": 6})
    msg = r.choices[0].message
    assert msg.reasoning_content == want_reasoning
    assert msg.content == want_answer
    assert r.usage.completion_tokens <= 24

    chunks = [
        c
        for c in ask(oai, max_tokens=24, stream=True, extra_body={"thinking_token_budget": 6})
        if c.choices
    ]
    kinds = [
        "r" if getattr(c.choices[0].delta, "reasoning_content", None) else "t"
        for c in chunks
        if getattr(c.choices[0].delta, "reasoning_content", None) or c.choices[0].delta.content
    ]
    assert kinds == sorted(kinds) and "r" in kinds and "t" in kinds  # reasoning, then answer
    reasoning = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks
    )
    answer = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert (reasoning, answer) == (want_reasoning, want_answer)


def test_without_a_budget_the_model_thinks_through_max_tokens(oai, ref):
    msg = ask(oai, max_tokens=24).choices[0].message
    assert msg.reasoning_content and not msg.content


def test_effort_takes_its_share_of_max_tokens(oai, ref):
    # "low" is min(1024, max_tokens / 4): 10 of 40 here; "none" closes the block at once
    r = ask(oai, max_tokens=40, reasoning_effort="low").choices[0].message
    assert (r.reasoning_content, r.content) == expected(ref, 10, 40)
    r = ask(oai, max_tokens=12, reasoning_effort="none").choices[0].message
    assert not r.reasoning_content and r.content == expected(ref, 0, 12)[1]


def test_a_prompt_without_thinking_ignores_the_budget(oai):
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    plain = ask(oai, max_tokens=10, extra_body=off).choices[0].message
    budgeted = ask(oai, max_tokens=10, extra_body={**off, "thinking_token_budget": 2})
    assert budgeted.choices[0].message.content == plain.content and plain.content


@pytest.mark.parametrize(
    "body, param",
    [
        ({"thinking_token_budget": -1}, "thinking_token_budget"),
        ({"thinking_token_budget": "many"}, "thinking_token_budget"),
        ({"reasoning_effort": "huge"}, "reasoning_effort"),
    ],
)
def test_bad_budgets_are_400s(oai, body, param):
    with pytest.raises(openai.BadRequestError) as exc:
        ask(oai, max_tokens=8, extra_body=body)
    assert exc.value.body["param"] == param


def test_a_model_without_a_reasoning_block_ignores_the_budget():
    class NoThinking:
        has_thinking = False

    assert think_budget(NoThinking(), GenerationParams(reasoning_budget=4), True, False) is None


def test_a_block_the_model_opens_is_counted_and_a_long_end_marker_forced_in_order():
    # start marker 7, end marker (8, 9); the prompt is [1, 2]; budget 2
    proc = ThinkBudget(2, (7,), (8, 9), in_reasoning=False)
    free = mx.zeros((1, 16))

    def top(context: list[int]) -> int:
        return int(mx.argmax(proc(mx.array([context]), free), axis=-1).item())

    ctx = [1, 2]
    assert top(ctx) == 0  # not reasoning: untouched
    for token, want in [(7, 0), (3, 0), (4, 8), (8, 9), (9, 0), (5, 0)]:
        ctx.append(token)
        assert top(ctx) == want, ctx
    # a second block after the budget is spent closes at once
    ctx.append(7)
    assert top(ctx) == 8


def test_a_constraint_governs_the_answer_after_a_forced_close(oai, ref):
    # The grammar waits for the end marker (the prompt opened the block); the budget forces it.
    r = ask(oai, max_tokens=40, extra_body={"thinking_token_budget": 5, "guided_regex": "Paris"})
    msg = r.choices[0].message
    assert (msg.reasoning_content, msg.content) == (expected(ref, 5, 40)[0], "Paris")
    assert r.choices[0].finish_reason == "stop"


def test_budgets_are_per_row_in_a_shared_batch(oai, ref):
    # Rows decoding together: each keeps its own budget, and a row without one is untouched.
    budgets = [3, None, 8, None]
    alone = ask(oai, max_tokens=20).choices[0].message.reasoning_content

    def one(budget):
        extra = {} if budget is None else {"thinking_token_budget": budget}
        return ask(oai, max_tokens=20, extra_body=extra).choices[0].message

    with ThreadPoolExecutor(len(budgets)) as pool:
        got = list(pool.map(one, budgets))
    for budget, msg in zip(budgets, got, strict=True):
        if budget is None:
            assert (msg.reasoning_content, msg.content or "") == (alone, "")
        else:
            assert (msg.reasoning_content, msg.content) == expected(ref, budget, 20)


def test_a_budget_that_cannot_bind_attaches_nothing():
    from types import SimpleNamespace

    from mlxd.shared.params import GenerationParams
    from mlxd.worker.chat.think_budget import ThinkBudget, think_budget

    tok = SimpleNamespace(has_thinking=True, think_start_tokens=[5], think_end_tokens=[6])
    huge = GenerationParams(max_tokens=6, reasoning_budget=2**31)  # once a 503 (int32 overflow)
    assert think_budget(tok, huge, True, False) is None
    assert (
        think_budget(tok, GenerationParams(max_tokens=6, reasoning_budget=6), True, False) is None
    )
    binding = think_budget(tok, GenerationParams(max_tokens=6, reasoning_budget=5), True, False)
    assert isinstance(binding, ThinkBudget)
