"""The worker's OpenAI surface, driven over its UNIX socket by the official SDK."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

MSG = [{"role": "user", "content": "Tell me a story about a mountain."}]


def chat_text(oai, **kw) -> str:
    r = oai.chat.completions.create(model="tiny", messages=kw.pop("messages", MSG), **kw)
    return r.choices[0].message.content


def stream_text(oai, **kw) -> tuple[str, list]:
    chunks = list(
        oai.chat.completions.create(
            model="tiny", messages=kw.pop("messages", MSG), stream=True, **kw
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def test_chat_reports_length_and_usage(oai):
    r = oai.chat.completions.create(model="tiny", messages=MSG, max_tokens=12, temperature=0)
    assert r.object == "chat.completion"
    assert r.model == "tiny"
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_max_completion_tokens_gives_exactly_that_many_tokens(oai):
    r = oai.chat.completions.create(
        model="tiny",
        messages=MSG,
        max_completion_tokens=7,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7
    content = r.choices[0].logprobs.content
    assert len(content) == 7
    assert all(len(t.top_logprobs) == 3 for t in content)
    # The sampled token is greedy here, so it is the most likely one.
    assert all(t.logprob >= max(x.logprob for x in t.top_logprobs) - 1e-4 for t in content)


def test_stream_matches_plain_response(oai):
    plain = chat_text(oai, max_tokens=24, temperature=0)
    text, chunks = stream_text(
        oai, max_tokens=24, temperature=0, stream_options={"include_usage": True}
    )
    assert text == plain
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24


def test_stream_without_include_usage_has_no_usage_chunk(oai):
    _, chunks = stream_text(oai, max_tokens=4, temperature=0)
    assert all(c.usage is None for c in chunks)


def test_stop_string_across_tokens_is_cut_and_not_emitted(oai):
    full = chat_text(oai, max_tokens=40, temperature=0)
    assert len(full) > 20
    stop = full[10:16]
    cut = full[: full.find(stop)]
    r = oai.chat.completions.create(
        model="tiny", messages=MSG, max_tokens=40, temperature=0, stop=[stop, "never-appears-xyz"]
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == cut
    streamed, _ = stream_text(oai, max_tokens=40, temperature=0, stop=stop)
    assert streamed == cut


def test_completions_plain_and_stream(oai):
    r = oai.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=10, temperature=0
    )
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 10
    chunks = list(
        oai.completions.create(
            model="tiny", prompt="Once upon a time", max_tokens=10, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_completions_token_prompt_and_logprobs(oai):
    r = oai.completions.create(
        model="tiny", prompt=[5, 6, 7, 8], max_tokens=5, temperature=0, logprobs=2
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == r.choices[0].text


def test_seed_gives_same_text_whatever_shares_the_batch(oai):
    kw = {"max_tokens": 24, "temperature": 1.0, "seed": 1234}
    alone = chat_text(oai, **kw)
    assert chat_text(oai, **{**kw, "seed": 99}) != alone
    with ThreadPoolExecutor(6) as pool:
        others = [
            pool.submit(
                chat_text,
                oai,
                max_tokens=40,
                temperature=0.9,
                messages=[{"role": "user", "content": f"noise {i}"}],
            )
            for i in range(4)
        ]
        time.sleep(0.05)
        again = pool.submit(chat_text, oai, **kw)
        assert again.result() == alone
        [f.result() for f in others]


def test_eight_concurrent_streams_complete(oai):
    prompts = [[{"role": "user", "content": f"Question number {i}: why?"}] for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        results = list(
            pool.map(
                lambda m: stream_text(
                    oai,
                    messages=m,
                    max_tokens=16 + len(m[0]["content"]) % 5,
                    temperature=0,
                    stream_options={"include_usage": True},
                ),
                prompts,
            )
        )
    for (text, chunks), m in zip(results, prompts):
        assert text
        assert chunks[-1].usage.completion_tokens == 16 + len(m[0]["content"]) % 5
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_disconnect_frees_its_row(oai, http):
    before = http.get("/stats").json()["cancellations"]
    stream = oai.chat.completions.create(
        model="tiny", messages=MSG, max_tokens=400, temperature=0, stream=True
    )
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        s = http.get("/stats").json()
        if s["rows_active"] == 0 and s["cancellations"] > before:
            return
        time.sleep(0.05)
    raise AssertionError(f"row not freed: {s}")


def test_health_models_stats(http):
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["model"] == "tiny" and health["generation"] == 0
    assert isinstance(health["pid"], int)
    models = http.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "tiny"
    s = http.get("/stats").json()
    for key in (
        "rows_active",
        "rows_queued",
        "prompt_tokens",
        "generation_tokens",
        "prompt_tps",
        "decode_tps",
        "memory_active_bytes",
        "cancellations",
    ):
        assert key in s
