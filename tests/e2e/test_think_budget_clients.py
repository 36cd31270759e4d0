"""Thinking budgets through a real daemon, driven by the official anthropic, openai and ollama
clients: reasoning stops at the budget, an answer follows, and bad budgets are 400s.

The model's template opens <think> in the generation prompt and its random weights never close
the block, so without a budget every token is reasoning. The budget's reasoning must equal the
first N tokens of the same request without one (greedy), on every surface.
"""

from __future__ import annotations

import anthropic
import ollama
import openai
import pytest

from tiny_model import OPEN_THINK_TEMPLATE, build_tiny_model

MSG = [{"role": "user", "content": "Where is the Eiffel tower?"}]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def daemon(make_module_daemon, tmp_path_factory):
    folder = build_tiny_model(tmp_path_factory.mktemp("think"), chat_template=OPEN_THINK_TEMPLATE)
    return make_module_daemon(models={"t": folder})


@pytest.fixture(scope="module")
def claude(daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.url, api_key="sk-test", max_retries=0, timeout=120)


def test_anthropic_budget_tokens_closes_thinking_and_the_answer_follows(claude):
    # Anthropic's smallest budget is 1024: reasoning for 1024 tokens, then the text block.
    alone = claude.messages.create(model="t", max_tokens=1024, messages=MSG, extra_body=GREEDY)
    assert alone.content[0].type == "thinking"  # no budget: it never stops thinking
    assert not any(b.text for b in alone.content if b.type == "text")
    budget = {"type": "enabled", "budget_tokens": 1024}
    m = claude.messages.create(
        model="t", max_tokens=1040, messages=MSG, thinking=budget, extra_body=GREEDY
    )
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == alone.content[0].thinking
    assert m.content[1].text and m.usage.output_tokens <= 1040

    events = list(
        claude.messages.create(
            model="t",
            max_tokens=1040,
            messages=MSG,
            thinking=budget,
            extra_body=GREEDY,
            stream=True,
        )
    )
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    kinds = [d.type for d in deltas]
    assert kinds == sorted(kinds, key=lambda k: k != "thinking_delta")  # thinking, then text
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == (
        m.content[0].thinking
    )
    assert "".join(d.text for d in deltas if d.type == "text_delta") == m.content[1].text
    assert events[-1].type == "message_stop"


@pytest.mark.parametrize(
    "max_tokens, thinking, param",
    [
        (2000, {"type": "enabled", "budget_tokens": 1000}, "budget_tokens"),
        (1024, {"type": "enabled", "budget_tokens": 1024}, "max_tokens"),
        (2000, {"type": "enabled"}, "budget_tokens"),
    ],
)
def test_anthropic_bad_budgets_are_400s(claude, max_tokens, thinking, param):
    with pytest.raises(anthropic.BadRequestError) as exc:
        claude.messages.create(model="t", max_tokens=max_tokens, messages=MSG, thinking=thinking)
    assert exc.value.body["type"] == "error"
    assert exc.value.body["error"]["type"] == "invalid_request_error"
    assert param in exc.value.body["error"]["message"]


def test_openai_effort_and_budget_cut_the_reasoning(daemon):
    client = daemon.openai()

    def ask(max_tokens, **extra):
        r = client.chat.completions.create(
            model="t", messages=MSG, temperature=0, max_tokens=max_tokens, **extra
        )
        return r.choices[0].message

    first_ten = ask(10)
    assert first_ten.reasoning_content and not first_ten.content
    low = ask(40, reasoning_effort="low")  # min(1024, 40 / 4) = 10 tokens of reasoning
    assert low.reasoning_content == first_ten.reasoning_content and low.content
    budget = ask(40, extra_body={"thinking_token_budget": 10})
    assert (budget.reasoning_content, budget.content) == (low.reasoning_content, low.content)
    with pytest.raises(openai.BadRequestError) as exc:
        ask(40, reasoning_effort="enormous")
    assert exc.value.body["param"] == "reasoning_effort"


def test_responses_effort_splits_max_output_tokens(daemon):
    client = daemon.openai()
    ask = MSG[0]["content"]
    alone = client.responses.create(model="t", input=ask, temperature=0, max_output_tokens=10)
    r = client.responses.create(
        model="t", input=ask, temperature=0, max_output_tokens=40, reasoning={"effort": "low"}
    )
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "message"]
    assert r.output[0].content[0].text == alone.output[0].content[0].text
    assert r.output_text
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model="t", input=ask, reasoning={"effort": "lots"})
    assert exc.value.body["param"] == "reasoning.effort"


def test_ollama_think_levels_are_budgets(daemon):
    client = ollama.Client(host=daemon.url, timeout=120)
    first_ten = client.chat(
        model="t", messages=MSG, think=True, options={"temperature": 0, "num_predict": 10}
    )
    assert first_ten.message.thinking and not first_ten.message.content
    opts = {"temperature": 0, "num_predict": 40}
    low = client.chat(model="t", messages=MSG, think="low", options=opts)
    assert low.message.thinking == first_ten.message.thinking and low.message.content
    parts = list(client.chat(model="t", messages=MSG, think="low", options=opts, stream=True))
    kinds = [
        "t" if p.message.thinking else "c" for p in parts if p.message.thinking or p.message.content
    ]
    assert kinds == sorted(kinds, reverse=True) and {"t", "c"} <= set(kinds)
    assert "".join(p.message.thinking or "" for p in parts) == low.message.thinking
    assert "".join(p.message.content or "" for p in parts) == low.message.content
    # the client checks `think` itself; a raw body gets the server's 400
    bad = daemon.http.post("/api/chat", json={"model": "t", "messages": MSG, "think": "extreme"})
    assert bad.status_code == 400 and "think" in bad.json()["error"]
