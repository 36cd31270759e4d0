"""A worker group through the supervisor: the tiny model over 2 ranks (ring backend, loopback,
CPU), beside the same model in one process (docs/scale-out.md)."""

from __future__ import annotations

import os
import signal
import threading

import psutil
import pytest

from mlxd.shared.worker_spec import WorkerSpec

from procs import uds_client

CONFIG = """
[models.g]
group_size = 2
backend = "ring"
[models.odd]
group_size = 3
"""
MSG = [{"role": "user", "content": "Tell me about the sea"}]


@pytest.fixture(scope="module")
def d(module_daemon, tiny_model_dir):
    return module_daemon(
        models={"a": tiny_model_dir, "g": tiny_model_dir, "odd": tiny_model_dir}, config=CONFIG
    )


def ranks(d, model: str = "g") -> dict[int, int]:
    """{rank: pid} of the model's running worker processes."""
    out = {}
    for pid in d.worker_pids(model):
        try:
            spec = WorkerSpec.from_argv(psutil.Process(pid).cmdline())
        except psutil.Error:
            continue
        out[spec.group.rank if spec.group else 0] = pid
    return out


def chat(d, model: str, n: int = 16, **kw):
    return d.openai().chat.completions.create(
        model=model, messages=MSG, max_tokens=n, temperature=0, **kw
    )


def test_greedy_output_equals_single_process(d):
    group = chat(d, "g")
    single = chat(d, "a")
    assert group.choices[0].message.content == single.choices[0].message.content
    assert group.usage.completion_tokens == single.usage.completion_tokens
    pids = ranks(d)
    assert sorted(pids) == [0, 1]  # two processes serve g, one model to the admin API
    model = d.http.get("/admin/models/g").json()
    assert (model["state"], model["pid"], model["ranks"]) == ("ready", pids[0], [pids[0], pids[1]])


def test_batch_of_four_streams_completes(d):
    results: dict[int, tuple[str, str | None]] = {}

    def stream(i: int) -> None:
        msgs = [{"role": "user", "content": f"Story number {i}"}]
        text, finish = "", None
        for chunk in d.openai().chat.completions.create(
            model="g", messages=msgs, max_tokens=24, temperature=0.7, seed=i, stream=True
        ):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        results[i] = (text, finish)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == [0, 1, 2, 3]
    assert all(finish in ("length", "stop") and text for text, finish in results.values())
    # Seeded rows give the same text however the batch was made up: again, one at a time.
    i = 2
    again = d.openai().chat.completions.create(
        model="g",
        messages=[{"role": "user", "content": f"Story number {i}"}],
        max_tokens=24,
        temperature=0.7,
        seed=i,
    )
    assert again.choices[0].message.content == results[i][0]


def test_cancel_mid_stream_keeps_the_group_serving(d):
    before = ranks(d)
    got = 0
    with d.openai().chat.completions.create(
        model="g", messages=MSG, max_tokens=2000, temperature=0, stream=True
    ) as s:
        for _chunk in s:
            got += 1
            if got == 4:
                break  # the client leaves: the row is cancelled on every rank
    with uds_client(d.home / "run" / "g.sock", 10) as c:
        d.wait_for(lambda: c.get("/stats").json()["rows_active"] == 0, 30, "the row to leave")
        assert c.get("/stats").json()["cancellations"] >= 1
    # Both ranks dropped the row at the same step: the next request is answered, no restart.
    assert chat(d, "g").choices[0].message.content == chat(d, "a").choices[0].message.content
    assert ranks(d) == before


def test_kill_rank_one_restarts_the_group(d):
    chat(d, "g", 2)  # loaded on demand: both ranks up, whichever tests ran before this one
    before = ranks(d)
    assert sorted(before) == [0, 1]
    os.kill(before[1], signal.SIGKILL)
    # The other model keeps serving meanwhile.
    assert chat(d, "a", 4).choices[0].finish_reason == "length"
    d.wait_for(lambda: not psutil.pid_exists(before[0]), 30, "rank 0 of the old group to end")
    d.wait_for(lambda: d.status("g")["status"] != "loaded", 30, "the group to leave READY")
    reply = chat(d, "g", 4)  # the next request starts the whole group again
    assert reply.choices[0].finish_reason == "length"
    after = ranks(d)
    assert sorted(after) == [0, 1] and not set(after.values()) & set(before.values())
    model = d.http.get("/admin/models/g").json()
    assert model["restarts"] >= 1


def test_prompt_cache_hits_on_every_rank(d):
    # Rank 0 and its follower each keep their shard of the conversation's KV under the same
    # entry: a hit on rank 0 is a hit on rank 1, and the answer stays the same.
    msgs = [{"role": "user", "content": "Remember these words: " + "harbour lantern tide " * 20}]
    extra = {"prompt_cache_key": "conversation-1"}
    replies = [
        d.openai().chat.completions.create(
            model="g", messages=msgs, max_tokens=12, temperature=0, extra_body=extra
        )
        for _ in range(2)
    ]
    single = d.openai().chat.completions.create(
        model="a", messages=msgs, max_tokens=12, temperature=0
    )
    assert replies[1].usage.prompt_tokens_details.cached_tokens > 50
    texts = {r.choices[0].message.content for r in [*replies, single]}
    assert len(texts) == 1


@pytest.mark.slow
def test_drain_persists_every_ranks_shard_and_a_restart_restores_them(d):
    long = " ".join(f"Note {i}: the keeper counted {i * 3} ships." for i in range(25))
    msgs = [{"role": "user", "content": long}]

    def ask():
        return d.openai().chat.completions.create(
            model="g", messages=msgs, max_tokens=8, temperature=0
        )

    def unload():
        assert d.http.post("/admin/models/g/unload").json()["result"] == "unloaded"

    first = ask()
    unload()  # the drain: every rank writes its own shard of the entry, under one name
    shards = {p.parent.name: p.name for p in (d.home / "cache").rglob("*.safetensors")}
    assert set(shards) == {"rank0-of-2", "rank1-of-2"} and len(set(shards.values())) == 1
    again = ask()  # a fresh group: every rank restores its shard from its own folder
    assert again.usage.prompt_tokens_details.cached_tokens >= 0.9 * again.usage.prompt_tokens
    assert again.choices[0].message.content == first.choices[0].message.content
    # Rank 1 loses its shard: no rank restores (a miss everywhere), and the answer holds.
    unload()
    for p in (d.home / "cache").rglob("rank1-of-2/*"):
        p.unlink()
    cold = ask()
    assert cold.usage.prompt_tokens_details.cached_tokens < 0.5 * cold.usage.prompt_tokens
    assert cold.choices[0].message.content == first.choices[0].message.content


def test_structured_output_is_asked_for_in_words_on_a_group(d):
    # A grammar could not run on the followers: the request is answered unconstrained, with
    # a Warning, as when a grammar cannot be compiled.
    r = d.http.post(
        "/v1/chat/completions",
        json={
            "model": "g",
            "messages": MSG,
            "max_tokens": 8,
            "response_format": {"type": "json_object"},
        },
    )
    assert r.status_code == 200
    assert "worker group" in r.headers["warning"]
    assert r.json()["choices"][0]["finish_reason"] in ("length", "stop")


def test_a_model_that_cannot_be_split_is_refused(d):
    # The tiny model's 4 attention heads do not split 3 ways: every rank refuses at load.
    r = d.http.post("/v1/chat/completions", json={"model": "odd", "messages": MSG, "max_tokens": 4})
    assert r.status_code == 503
    error = r.json()["error"]["message"]
    assert "could not be loaded" in error
    # FATAL once every rank is reaped (a load error is not retried).
    state = lambda: d.http.get("/admin/models/odd").json()["state"]  # noqa: E731
    d.wait_for(lambda: state() == "fatal", 30, "the group to be FATAL")
    model = d.http.get("/admin/models/odd").json()
    assert "does not split into 3 equal shards" in model["last_error"]
    assert not d.worker_pids("odd")


def test_unload_stops_every_rank_cleanly(d):
    assert chat(d, "g", 2).choices[0].finish_reason == "length"
    before = ranks(d)
    restarts = d.http.get("/admin/models/g").json()["restarts"]
    r = d.http.post("/admin/models/g/unload").json()
    assert r["result"] == "unloaded" and r["model"]["state"] == "stopped"
    d.wait_for(lambda: not any(psutil.pid_exists(p) for p in before.values()), 30, "ranks gone")
    # A clean stop (rank 0 told its follower to stop in lockstep), not a crash.
    assert d.http.get("/admin/models/g").json()["restarts"] == restarts
    assert chat(d, "g", 2).choices[0].finish_reason == "length"  # loads again on demand
