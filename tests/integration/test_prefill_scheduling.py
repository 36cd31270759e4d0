"""Prefill scheduling by order of events (the engine in process, a worker for READY).

No timing anywhere: the engine's step trace says which step admitted, prefilled and decoded
which row, and the tests assert the order of those events.
"""

from __future__ import annotations

import json
import os
import random
import threading
from dataclasses import replace

import pytest

from mlxd.shared.errors import PayloadTooLarge
from mlxd.shared.params import GenerationParams
from mlxd.worker.engine import steplog
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.rows import Submission
from mlxd.worker.engine.sched.planner import PlanConfig
from mlxd.worker.engine.steplog import StepLog
from mlxd.worker.engine.trace import StepTrace
from mlxd.worker.kv.budget import padded, row_tokens
from mlxd.worker.model.load import load_model

from procs import start_worker, stop, uds_client


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(tiny_model_dir, "tiny")


class Rows:
    """Submissions whose events are recorded, and the engine's trace."""

    def __init__(self):
        self.steps = []
        self.events: dict[str, list] = {}
        self.event_steps: dict[str, list[int]] = {}  # the step each event came out in
        self.done: dict[str, threading.Event] = {}
        self.on_step = None  # called with each StepTrace on the engine thread

    def trace(self, st):
        self.steps.append(st)
        if self.on_step is not None:
            self.on_step(st)

    def sub(self, rid: str, n_prompt: int, max_tokens: int) -> Submission:
        rng = random.Random(rid)
        self.events[rid], self.done[rid] = [], threading.Event()
        self.event_steps[rid] = []

        def sink(ev):  # on the engine thread, before the trace of the step it came out in
            self.events[rid].append(ev)
            self.event_steps[rid].append(len(self.steps) + 1)
            if ev.finish_reason is not None:
                self.done[rid].set()

        params = GenerationParams(max_tokens=max_tokens, temperature=0.0, top_p=1.0, top_k=0)
        prompt = [rng.randrange(10, 2000) for _ in range(n_prompt)]
        return Submission(rid, prompt, params, sink)

    def wait(self, *rids: str) -> None:
        for rid in rids:
            assert self.done[rid].wait(120), rid
            assert self.events[rid][-1].error is None, self.events[rid][-1].error

    def first(self, rid: str, field: str) -> int:
        """The first step whose `field` names `rid`."""
        return next(st.step for st in self.steps if rid in getattr(st, field))


def _engine(loaded, rows: Rows, **kw) -> Engine:
    engine = Engine(loaded, trace=rows.trace, **kw)
    engine.start()
    return engine


def _long_then_short_at_step_2(engine: Engine, rows: Rows, long, short) -> None:
    """Submit `long`, then `short` once step 2 is traced (the long one prefilling); wait for
    both."""

    def submit_short_at_step_2(st):
        if st.step == 2:
            engine.submit(short)

    rows.on_step = submit_short_at_step_2
    engine.submit(long)
    rows.wait("long", "short")


def _close(engine: Engine) -> None:
    engine.stop()
    assert engine.join(30)


@pytest.mark.parametrize("fold", [True, False], ids=["first-token-from-prefill", "mlx-lm-order"])
def test_a_short_request_during_a_long_prefill_decodes_before_the_long_one_is_prefilled(
    loaded, fold
):
    rows = Rows()
    long, short = rows.sub("long", 600, 2), rows.sub("short", 5, 4)
    plan = PlanConfig(idle_chunk=64, step_budget=32, min_chunk=8)
    engine = _engine(loaded, rows, batch=4, plan=plan, first_token_from_prefill=fold)
    # Folded, a prompt's last token is prefilled with the rest and its forward samples the
    # first token; in mlx-lm's order it waits for a decode forward of its own.
    held_back = 0 if fold else 1

    _long_then_short_at_step_2(engine, rows, long, short)
    _close(engine)

    by_step = {st.step: st for st in rows.steps}
    # Idle: the long prompt alone goes in large chunks.
    assert [by_step[s].chunks["long"][1] for s in (1, 2)] == [64, 64]
    a = rows.first("short", "admitted")
    joined = by_step[a]
    # The newcomer is prefilled whole in the step that admits it; the long row's chunk
    # there is the busy budget's share, not an idle chunk.
    assert joined.chunks["short"] == (0, 5 - held_back)
    assert joined.chunks["long"][1] <= 32
    # It goes to the decode batch in that same step (its first token sampled there), and its
    # first token goes out at that step's end: it waited behind one chunk of the long
    # prompt, not two (mlx-lm returns it from the next step, after another chunk)...
    assert rows.event_steps["short"][0] == a and rows.first("short", "sent_first") == a
    # ...the next step returns that token again, and nothing goes out for it twice...
    first_token = rows.first("short", "decoded")
    assert first_token == a + 1
    # ...while the long row is still prefilling, and it decodes at every step until done.
    long_prefill_end = max(st.step for st in rows.steps if "long" in st.chunks)
    assert first_token < long_prefill_end
    finished = rows.first("short", "finished")
    assert all("short" in by_step[s].decoded for s in range(first_token, finished + 1))
    assert len(rows.events["short"]) == 4 and rows.events["short"][-1].completion_tokens == 4
    assert [e.completion_tokens for e in rows.events["short"]] == [1, 2, 3, 4]
    # Busy steps stay within the budget while the short row is in; then idle chunks again.
    assert all(by_step[s].chunks["long"][1] <= 32 for s in range(a, finished + 1))
    assert finished < long_prefill_end and by_step[finished + 1].chunks["long"][1] == 64
    # The long prompt was prefilled exactly once, in order, with no gaps.
    spans = [st.chunks["long"] for st in rows.steps if "long" in st.chunks]
    assert spans[0][0] == 0 and all(a_ + n == b_ for (a_, n), (b_, _) in zip(spans, spans[1:]))
    assert spans[-1][0] + spans[-1][1] == 600 - held_back


def test_prompt_progress_counts_prefilled_tokens_as_the_prefill_goes(loaded):
    """What a request shows as done of its prompt (the access log's `prompt_done` when its
    client leaves mid-prefill) grows with each chunk, not only by what the cache gave."""
    rows = Rows()
    long = rows.sub("long", 600, 2)
    plan = PlanConfig(idle_chunk=64, step_budget=32, min_chunk=8)
    engine = _engine(loaded, rows, batch=2, plan=plan)
    seen: list[tuple[int, int]] = []  # (tokens prefilled by the end of a step, prompt_done)
    prefilled = 0

    def record(st):
        nonlocal prefilled
        if "long" in st.chunks:
            prefilled += st.chunks["long"][1]
            seen.append((prefilled, long.prompt_done))

    rows.on_step = record
    engine.submit(long)
    rows.wait("long")
    _close(engine)
    assert len(seen) >= 5 and long.prompt_cached == 0
    assert all(done == n for n, done in seen), seen  # 64, 128, ... while the client waits
    # The last chunk holds the last token too (its forward samples the first token).
    assert seen[-1] == (600, 600), seen
    assert long.prompt_done == 600


def test_an_idle_batch_prefills_a_long_prompt_in_large_chunks(loaded):
    rows = Rows()
    engine = _engine(loaded, rows, batch=4, plan=PlanConfig(idle_chunk=256, step_budget=128))
    engine.submit(rows.sub("long", 600, 1))
    rows.wait("long")
    _close(engine)
    assert [st.chunks["long"] for st in rows.steps if "long" in st.chunks] == [
        (0, 256),
        (256, 256),
        (512, 88),  # the last token too: its forward samples the first token
    ]


def test_rows_beyond_the_kv_budget_queue_then_all_complete(loaded):
    rows = Rows()
    bpt = loaded.kv_bytes_per_token
    one = padded(row_tokens(256, 4))  # 512 positions
    # Room for two such rows (2 x 512), not three.
    engine = Engine(loaded, batch=8, kv_budget_bytes=bpt * (2 * one + 100), trace=rows.trace)
    subs = [rows.sub(f"r{i}", 256, 4) for i in range(3)]
    for sub in subs:  # queued before the engine runs: one admission pass sees all three
        engine.submit(sub)
    engine.start()
    rows.wait("r0", "r1", "r2")
    _close(engine)

    assert rows.steps[0].admitted == ["r0", "r1"] and rows.steps[0].queued == 1
    a2 = rows.first("r2", "admitted")
    assert a2 > min(rows.first("r0", "finished"), rows.first("r1", "finished"))
    assert all(st.queued == 1 for st in rows.steps if st.step < a2)
    assert all(len(rows.events[r]) == 4 for r in ("r0", "r1", "r2"))
    assert engine.stats()["rows_queued"] == 0


def test_a_row_that_could_never_fit_is_refused_before_any_work(loaded):
    rows = Rows()
    engine = Engine(loaded, batch=4, kv_budget_bytes=loaded.kv_bytes_per_token * 300)
    with pytest.raises(PayloadTooLarge) as exc:
        engine.submit(rows.sub("huge", 1000, 8))
    assert exc.value.status == 413 and "1000 prompt tokens" in exc.value.message
    assert engine.queued_rows == 0 and not rows.events["huge"]


def test_a_row_that_asked_for_no_budget_ends_where_the_kv_budget_does(loaded):
    """No max_tokens (the context's room, 4096 here) on a budget of 256 positions: the row
    runs, writes what the budget holds and ends with "length", where a row that asked for that
    much output is refused."""
    rows = Rows()
    engine = _engine(loaded, rows, batch=4, kv_budget_bytes=loaded.kv_bytes_per_token * 300)
    asked = rows.sub("asked", 40, loaded.context_limit - 40)
    with pytest.raises(PayloadTooLarge):
        engine.submit(asked)
    open_row = rows.sub("open", 40, loaded.context_limit - 40)
    open_row.params = replace(
        open_row.params, max_tokens_open=True, logit_bias=dict.fromkeys(loaded.eos_ids, -100.0)
    )
    engine.submit(open_row)
    rows.wait("open")
    _close(engine)
    assert (
        len(rows.events["open"]) == 256 - 40 and rows.events["open"][-1].finish_reason == "length"
    )


def test_warm_up_runs_before_ready_and_an_impossible_row_gets_413(tiny_model_dir, short_tmp):
    sock, log = short_tmp / "prefill.sock", short_tmp / "prefill.log"
    budget = 4 * 2 * 64 * 2 * 4 * 768  # the tiny model (float32 on the CPU): 768 positions
    proc = start_worker(
        tiny_model_dir,
        sock,
        "tiny",
        "--context-limit",
        "2048",
        "--kv-budget-bytes",
        str(budget),
        log=log,
    )
    try:
        with uds_client(sock) as c:
            stats = c.get("/stats").json()
            assert stats["warmup_s"] is not None and stats["kv_budget_bytes"] == budget
            lines = log.read_text().splitlines()
            warm = next(i for i, line in enumerate(lines) if "warm-up" in line)
            ready = next(i for i, line in enumerate(lines) if "ready model=tiny" in line)
            assert warm < ready
            small = {
                "model": "tiny",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
            }
            assert c.post("/v1/chat/completions", json=small).status_code == 200
            long_text = " ".join(f"w{i}" for i in range(300))  # ~840 tokens
            big = {**small, "messages": [{"role": "user", "content": long_text}]}
            r = c.post("/v1/chat/completions", json=big)
            assert r.status_code == 413
            err = r.json()["error"]
            assert err["code"] == "kv_budget_exceeded" and "prompt tokens" in err["message"]
            r = c.post("/v1/messages", json=big)
            assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
            assert c.get("/stats").json()["rows_queued"] == 0
    finally:
        stop(proc)


def test_the_step_log_has_a_line_per_step_with_its_prefill_and_decode(loaded, tmp_path):
    rows = Rows()
    path = tmp_path / "steps.jsonl"
    log = StepLog(path, "tiny")

    def both(st):
        rows.trace(st)
        log(st)

    engine = Engine(
        loaded, batch=4, plan=PlanConfig(idle_chunk=64, step_budget=32, min_chunk=8), trace=both
    )
    engine.start()
    for rid in ("a", "b"):
        engine.submit(rows.sub(rid, 150, 3))
    rows.wait("a", "b")
    _close(engine)

    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["step"] for x in lines] == [st.step for st in rows.steps]
    assert {(x["model"], x["pid"]) for x in lines} == {("tiny", os.getpid())}
    assert all(x["s"] > 0 for x in lines) and lines[0]["t"] == 0
    assert [x["t"] for x in lines] == sorted(x["t"] for x in lines)
    # Each 150-token prompt is prefilled in chunks, its last token with them.
    assert sum(x["prefill_tokens"] for x in lines) == 2 * 150
    assert max(x["prefill_tokens"] for x in lines) <= 64 * 2
    assert sum(x["decoded"] for x in lines) == 2 * 3
    assert sum(x["admitted"] for x in lines) == 2 and sum(x["finished"] for x in lines) == 2


def test_the_step_log_stops_at_its_bound_and_says_so(tmp_path):
    path = tmp_path / "steps.jsonl"
    log = StepLog(path, max_lines=3)
    for i in range(1, 6):
        log(StepTrace(i, 64, started=float(i), seconds=0.5))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3] and "end" in lines[-1]


def test_a_step_log_that_cannot_be_opened_is_skipped(tmp_path, monkeypatch):
    assert steplog.open_step_log(tmp_path / "missing" / "steps.jsonl") is None
    assert steplog.open_step_log(None) is None
    assert isinstance(steplog.open_step_log(tmp_path / "steps.jsonl", "tiny"), StepLog)
    # a group logs from rank 0 only
    assert steplog.open_step_log(tmp_path / "steps.jsonl", "tiny", follower=True) is None


def test_with_a_step_time_target_busy_steps_shrink_to_the_measured_pace(loaded):
    """Issue 33's step-time target, by order of events: a short request arriving while a
    long prompt prefills decodes beside chunks sized to the pace (here a target so small
    that a step's share is min_chunk), and the long prompt goes back to idle chunks once it
    is alone. No clock is read by the test: the engine measures, the plan follows."""
    rows = Rows()
    long, short = rows.sub("long", 600, 2), rows.sub("short", 5, 6)
    plan = PlanConfig(idle_chunk=64, step_budget=64, min_chunk=8, step_target_s=1e-6)
    engine = _engine(loaded, rows, batch=4, plan=plan)

    _long_then_short_at_step_2(engine, rows, long, short)
    stats = engine.stats()
    _close(engine)
    by_step = {st.step: st for st in rows.steps}
    assert [by_step[s].chunks["long"][1] for s in (1, 2)] == [64, 64]  # idle: large chunks
    a, finished = rows.first("short", "admitted"), rows.first("short", "finished")
    # Busy: the budget (64) is cut to the pace's share, the floor of min_chunk per row.
    assert all(by_step[s].chunks["long"][1] == 8 for s in range(a, finished + 1))
    assert by_step[finished + 1].chunks["long"][1] == 64  # alone again: idle chunks
    assert stats["prefill_target_s"] == 1e-6 and stats["prefill_pace_tps"] > 0
    # Greedy identity: chunks cut by the pace change no token (mlx-lm's own generation).
    for rid, sub in (("long", long), ("short", short)):
        text = "".join(e.text for e in rows.events[rid])
        assert text and text == _mlx_lm_text(loaded, sub.prompt, sub.params.max_tokens), rid


def _mlx_lm_text(loaded, prompt: list[int], max_tokens: int) -> str:
    """mlx-lm's greedy generation on `prompt`, decoded, up to an end-of-sequence token."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    ids = []
    for token, _ in generate_step(mx.array(prompt), loaded.model, max_tokens=max_tokens):
        if int(token) in loaded.eos_ids:
            break
        ids.append(int(token))
    return loaded.tokenizer.decode(ids)
