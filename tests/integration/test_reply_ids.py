"""A reply re-sent in the next turn gets back the ids the model generated (cache/replies.py).

On the tiny model's byte-level BPE, "em" written four times by the model is four tokens, but
the text "emememem" tokenizes as two ("emem" twice): without the ids given back, the cache
match of turn 2 would stop where the reply starts. The oracle is mlx-lm's greedy generation
on the spliced ids: the turn-1 prompt, the generated ids, the template's text after them.
"""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.generate import generate_step

from procs import start_worker, stop, uds_client, uds_openai

EM = 296  # "em": four of them re-tokenize as two "emem" tokens
N = 4  # tokens the model is made to write in turn 1
LONG = " ".join(f"Fact {i}: the river flows past stone number {i * 7}." for i in range(30))


@pytest.fixture(scope="module")
def ref(tiny_model_dir):
    return mlx_lm.load(str(tiny_model_dir))


def greedy(ref, ids: list[int], n: int) -> str:
    model, tok = ref
    out: list[int] = []
    for token, _ in generate_step(mx.array(ids), model, max_tokens=n):
        if int(token) in tok.eos_token_ids:
            break
        out.append(int(token))
    return tok.decode(out)


def render(tok, messages) -> str:
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def spliced_ids(tok, first: list[dict], second: list[dict], reply: str) -> list[int]:
    """Turn 2 as mlx-lm's server would send it: turn 1's prompt, its generated ids, then the
    template's text after the reply (it starts with a special token: tokenized alone alike)."""
    head, full = render(tok, first), render(tok, second)
    assert full.startswith(head + reply + "<|im_end|>")
    tail = full[len(head) + len(reply) :]
    return (
        tok.encode(head, add_special_tokens=False)
        + [EM] * N
        + tok.encode(tail, add_special_tokens=False)
    )


def turn_one(oai, messages):
    r = oai.chat.completions.create(
        model="tiny", messages=messages, max_tokens=N, temperature=0, logit_bias={str(EM): 100}
    )
    return r, r.choices[0].message.content


def ask(oai, messages, n=8):
    return oai.chat.completions.create(model="tiny", messages=messages, max_tokens=n, temperature=0)


def splices(sock) -> int:
    with uds_client(sock) as c:
        return c.get("/stats").json()["cache_reply_splices"]


def test_the_next_turn_reuses_the_whole_reply_and_generates_on_its_ids(
    tiny_model_dir, short_tmp, ref
):
    _, tok = ref
    sock = short_tmp / "replyids.sock"
    proc = start_worker(tiny_model_dir, sock, "tiny", "--no-ssd-cache")
    try:
        oai = uds_openai(sock)
        first = [{"role": "user", "content": "Say it."}]
        r1, reply = turn_one(oai, first)
        assert reply == tok.decode([EM] * N) == "emememem"
        assert r1.usage.completion_tokens == N
        plain = tok.encode(render(tok, [*first, {"role": "assistant", "content": reply}]))
        assert plain[r1.usage.prompt_tokens : r1.usage.prompt_tokens + N] != [EM] * N

        # A client that edited the reply gets the normal tokenization: no splice.
        edited = [*first, {"role": "assistant", "content": reply + "!"}]
        edited.append({"role": "user", "content": "Again."})
        r = ask(oai, edited)
        assert r.usage.prompt_tokens_details.cached_tokens < r1.usage.prompt_tokens + N
        normal = tok.encode(render(tok, edited), add_special_tokens=False)
        assert r.usage.prompt_tokens == len(normal)
        assert r.choices[0].message.content == greedy(ref, normal, 8)
        assert splices(sock) == 0

        # The reply as written: the cache covers all of turn 1, prompt and reply, and
        # generation runs on the generated ids.
        second = [*first, {"role": "assistant", "content": reply}]
        second.append({"role": "user", "content": "Again."})
        r2 = ask(oai, second)
        ids = spliced_ids(tok, first, second, reply)
        assert r2.usage.prompt_tokens == len(ids)
        assert r2.usage.prompt_tokens_details.cached_tokens == r1.usage.prompt_tokens + N
        assert r2.choices[0].message.content == greedy(ref, ids, 8)
        assert splices(sock) == 1
    finally:
        stop(proc)


def test_replies_survive_a_restart_on_the_ssd_tier(tiny_model_dir, short_tmp, ref):
    _, tok = ref
    sock = short_tmp / "replyssd.sock"
    cache = short_tmp / "replyssd-cache"
    first = [{"role": "user", "content": LONG}]
    proc = start_worker(tiny_model_dir, sock, "tiny", "--ssd-cache-dir", str(cache))
    try:
        r1, reply = turn_one(uds_openai(sock), first)
        with uds_client(sock) as c:
            assert c.post("/admin/drain").json()["cache_persisted"] is True
    finally:
        assert stop(proc) == 0
    proc = start_worker(tiny_model_dir, sock, "tiny", "--ssd-cache-dir", str(cache))
    try:
        second = [*first, {"role": "assistant", "content": reply}]
        second.append({"role": "user", "content": "Again."})
        r2 = ask(uds_openai(sock), second)
        assert r2.usage.prompt_tokens_details.cached_tokens == r1.usage.prompt_tokens + N
        assert r2.choices[0].message.content == greedy(
            ref, spliced_ids(tok, first, second, reply), 8
        )
        with uds_client(sock) as c:
            s = c.get("/stats").json()
        assert s["cache_ssd_restores"] == 1 and s["cache_reply_splices"] == 1
    finally:
        stop(proc)
