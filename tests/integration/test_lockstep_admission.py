"""A row that fails to be admitted fails alone, except in a worker group, where ranks must
admit alike: there the engine ends (the supervisor restarts the group) and the row is told."""

from __future__ import annotations

import pytest

from mlxd.shared.params import GenerationParams
from mlxd.worker.engine.batch import Batch
from mlxd.worker.engine.rows import Submission
from mlxd.worker.engine.sched import schedule
from mlxd.worker.engine.sched.planner import PlanConfig


def _scheduler(monkeypatch, lockstep: bool):
    def broken_admit(batch, sub, tokenizer):
        raise RuntimeError(f"no memory for {sub.rid}")

    monkeypatch.setattr(schedule, "admit", broken_admit)
    sched = schedule.Scheduler(Batch(None, trimmable=True), 4, PlanConfig(), None)
    sched.lockstep = lockstep
    events: list = []
    for rid in ("r1", "r2"):
        sched.waiting.append(Submission(rid, [1, 2, 3], GenerationParams(), events.append))
    return sched, events


def test_alone_each_failed_row_fails_and_admission_goes_on(monkeypatch):
    sched, events = _scheduler(monkeypatch, lockstep=False)
    assert sched.admit(tokenizer=None) == []
    assert len(events) == 2 and all(e.error is not None for e in events)


def test_in_a_group_a_failed_row_ends_the_engine_after_telling_its_client(monkeypatch):
    sched, events = _scheduler(monkeypatch, lockstep=True)
    with pytest.raises(RuntimeError, match="no memory for r1"):
        sched.admit(tokenizer=None)
    assert len(events) == 1 and events[0].error is not None
