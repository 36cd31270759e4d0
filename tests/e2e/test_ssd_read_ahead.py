"""A model that comes back (unloaded, loaded again) has its newest SSD entries read back into
its RAM tier before its first request (worker/cache/read_ahead.py): the conversation it left
is then a RAM hit, not an SSD restore in front of the answer."""

from __future__ import annotations

import pytest

LONG = " ".join(f"Entry {i}: the ferry left pier {i % 7} at {i} past nine." for i in range(30))


def chat(d, content: str):
    msgs = [{"role": "user", "content": content}]
    return d.openai().chat.completions.create(model="a", messages=msgs, max_tokens=6, temperature=0)


def cache_stats(d) -> dict:
    return d.http.get("/admin/stats").json()["workers"]["a"]["body"]


# Off (the long tier): the same conversation restored by its request, as before read-ahead.
@pytest.mark.parametrize(
    "ahead", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["read-ahead", "off"]
)
def test_a_reloaded_model_serves_its_last_conversation_from_ram(make_daemon, ahead):
    d = make_daemon(env={"MLXD_SSD_READ_AHEAD": str(ahead).lower()})
    cold = chat(d, LONG)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    r = d.http.post("/admin/models/a/unload").json()
    assert r["drain"]["cache_persisted"] and r["drain"]["cache_ssd_entries"] >= 1
    assert d.http.post("/admin/models/a/load").json()["result"] == "loaded"

    if ahead:  # before any request: the entry is in RAM already
        st = d.wait_for(
            lambda: (s := cache_stats(d))["cache_read_ahead_done"] and s, 30, "read-ahead"
        )
        assert st["cache_read_ahead_entries"] >= 1 and st["cache_ram_entries"] >= 1
        assert st["cache_read_ahead_bytes"] > 0
    else:
        st = cache_stats(d)
        assert st["cache_ram_entries"] == 0 and st["cache_read_ahead_entries"] == 0

    warm = chat(d, LONG)
    assert warm.usage.prompt_tokens_details.cached_tokens >= 0.9 * warm.usage.prompt_tokens
    assert warm.choices[0].message.content == cold.choices[0].message.content
    st = cache_stats(d)
    assert st["cache_ssd_hits"] == (0 if ahead else 1)  # RAM served it, or a restore did
    assert st["cache_ram_hits"] >= 1
