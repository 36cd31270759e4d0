"""One row's failure never disturbs the others in the batch (the engine, in process)."""

from __future__ import annotations

import threading

from mlxd.shared.params import GenerationParams
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.rows import Submission
from mlxd.worker.engine.sched.inbox import Stop, Submit
from mlxd.worker.model.load import load_model


def _sub(rid: str, done: dict, processors=()):
    events = []
    finished = threading.Event()

    def sink(ev):
        events.append(ev)
        if ev.finish_reason is not None:
            done[rid] = events
            finished.set()

    params = GenerationParams(max_tokens=40, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0)
    return Submission(rid, [5, 6, 7, 8, 9], params, sink, processors=list(processors)), finished


def test_a_raising_processor_fails_its_row_only(tiny_model_dir):
    engine = Engine(load_model(tiny_model_dir, "tiny"), batch=4)
    engine.start()
    calls = {"n": 0}

    def explodes_on_third_step(tokens, logits):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("grammar state corrupted")
        return logits

    done: dict = {}
    good, good_done = _sub("good", done)
    bad, bad_done = _sub("bad", done, [explodes_on_third_step])
    engine.submit(good)
    engine.submit(bad)
    assert bad_done.wait(60) and good_done.wait(60)
    last_bad = done["bad"][-1]
    assert last_bad.finish_reason == "error" and "bad" in last_bad.error.message
    assert "grammar state corrupted" not in last_bad.error.message  # the log has it, not clients
    last_good = done["good"][-1]
    assert last_good.error is None and last_good.finish_reason == "length"
    assert last_good.completion_tokens == 40
    assert engine.dead is None and engine.active_rows == 0
    engine.stop()
    assert engine.join(10)


def test_a_submit_racing_the_engines_death_is_answered(tiny_model_dir):
    """The engine thread dies between a submit's look at `dead` and its put: the request
    still hears that the engine stopped, instead of waiting in a queue nobody reads."""
    engine = Engine(load_model(tiny_model_dir, "tiny"), batch=2, warmup=False)
    engine.start()
    assert engine.warmed.wait(60)
    put = engine._inbox.put

    def admit_fails(tokenizer):
        raise RuntimeError("the device went away")

    def put_after_death(cmd):
        if isinstance(cmd, Submit):  # submit() has checked `dead` already: now the thread dies
            engine._sched.admit = admit_fails
            put(Stop())  # wakes the thread, which then fails in admit and drains its inbox
            assert engine._stopped.wait(60) and engine.dead is not None
        put(cmd)

    engine._inbox.put = put_after_death
    events: list = []
    sub = Submission("late", [5, 6, 7], GenerationParams(max_tokens=4), events.append)
    engine.submit(sub)
    assert [ev.finish_reason for ev in events] == ["error"]
    assert "engine of this worker stopped" in events[0].error.message


def test_a_submit_after_the_engine_stopped_is_answered(tiny_model_dir):
    engine = Engine(load_model(tiny_model_dir, "tiny"), batch=2, warmup=False)
    engine.start()
    engine.stop()
    assert engine.join(30)
    events: list = []
    engine.submit(Submission("late", [5, 6, 7], GenerationParams(max_tokens=4), events.append))
    assert [ev.finish_reason for ev in events] == ["error"]
    assert engine.persist_cache().is_set() and engine.close_session("s").is_set()


def test_a_request_cancelled_before_the_engine_saw_it_is_counted_and_never_runs(tiny_model_dir):
    engine = Engine(load_model(tiny_model_dir, "tiny"), batch=2, warmup=False)
    events: list = []
    sub = Submission("gone", [5, 6, 7], GenerationParams(max_tokens=4), events.append)
    engine.submit(sub)
    engine.cancel(sub)  # the client left before the engine thread took either command
    engine.start()
    assert engine.close_session("barrier").wait(60)
    assert engine.cancellations == 1 and engine.active_rows == 0 and events == []
    engine.stop()
    assert engine.join(30)
