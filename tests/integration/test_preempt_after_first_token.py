"""A row preempted right after its first token went out ahead of the decode step that returns
it (emit.send_first) resumes with what it writes alone: nothing sent twice or skipped, and a
seeded row's draws go on from the token it sent (sched/preempt.py `park`).

The KV budget preempts the newest rows when a block is short, at whatever step that happens;
here the scheduler's own park runs, forced, at the step after each row sent its first token
ahead (once per row), beside a long row that keeps the batch busy.
"""

from __future__ import annotations

import threading

import pytest

from mlxd.shared.params import GenerationParams
from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.rows import Submission
from mlxd.worker.engine.sched import schedule
from mlxd.worker.engine.sched.planner import PlanConfig
from mlxd.worker.engine.sched.preempt import park
from mlxd.worker.model.load import load_model


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(tiny_model_dir, "tiny")


class _Rec:
    def __init__(self, rid: str, prompt: list[int], **params):
        self.events: list = []
        self.done = threading.Event()
        p = GenerationParams(**{"temperature": 0.0, "top_p": 1.0, "top_k": 0, **params})
        self.sub = Submission(rid, prompt, p, self._sink)

    def _sink(self, ev) -> None:
        self.events.append(ev)
        if ev.finish_reason is not None:
            self.done.set()

    @property
    def seen(self) -> tuple:
        """What the client saw: the text, each event's token count, how it ended."""
        return (
            "".join(e.text for e in self.events),
            [e.completion_tokens for e in self.events],
            self.events[-1].finish_reason,
        )


def _run(engine: Engine, recs: list[_Rec]) -> None:
    for r in recs:
        engine.submit(r.sub)
    for r in recs:
        assert r.done.wait(120), r.sub.rid


def _kinds(eos_ids) -> list[tuple[str, list[int], dict]]:
    no_end = dict.fromkeys(eos_ids, -100.0)
    out = []
    for i in range(3):
        prompt = [40 + 11 * i + (j * 7) % 300 for j in range(10 + 5 * i)]
        seeded = dict(temperature=1.0, seed=100 + i, logit_bias=no_end)
        out += [
            (f"seeded{i}", prompt, {**seeded, "max_tokens": 12}),
            (f"seeded-short{i}", prompt, {**seeded, "max_tokens": 3}),
            (f"greedy{i}", prompt, {"logit_bias": no_end, "max_tokens": 12}),
        ]
    return out


@pytest.mark.parametrize("cached", [True, False], ids=["parked-in-ram-cache", "recomputed"])
def test_a_row_preempted_after_its_first_token_went_out_ahead_writes_what_it_writes_alone(
    loaded, monkeypatch, cached
):
    kinds = _kinds(loaded.eos_ids)
    plan = PlanConfig(idle_chunk=16, step_budget=16, min_chunk=8)
    cache = PromptCache(1 << 28, None, 0) if cached else None
    engine = Engine(loaded, batch=4, cache=cache, plan=plan, warmup=False)
    engine.start()
    try:
        alone = {}
        for name, prompt, params in kinds:
            rec = _Rec(name, prompt, **params)
            _run(engine, [rec])
            alone[name] = rec.seen

        parked: list[tuple[str, int]] = []
        grow = schedule.Scheduler.grow

        def grow_then_park_the_rows_sent_ahead(self):
            grow(self)
            for row in list(self.batch.rows.values()):
                if row.sent_ahead and row.sub.rid not in {rid for rid, _ in parked}:
                    parked.append((row.sub.rid, row.generated))
                    park(self.batch, row)  # as grow() parks a row the budget preempts
                    self.parked[id(row.sub)] = row
                    self.waiting.appendleft(row.sub)
                    self.preempted.append(row.sub.rid)

        monkeypatch.setattr(schedule.Scheduler, "grow", grow_then_park_the_rows_sent_ahead)
        long = _Rec("long", list(range(30, 130)), max_tokens=150)
        engine.submit(long.sub)
        busy = [_Rec(name, prompt, **params) for name, prompt, params in kinds]
        _run(engine, busy)
        assert long.done.wait(120)
    finally:
        engine.stop()
        assert engine.join(30)

    # Every row was parked once, right after its first token (sent ahead) went out...
    assert sorted(rid for rid, _ in parked) == sorted(["long", *alone])
    assert all(generated == 1 for _, generated in parked)
    # ...and each wrote what it writes alone: the same text, counts 1, 2, ... once each.
    for rec in busy:
        assert rec.seen == alone[rec.sub.rid], rec.sub.rid
        assert rec.seen[1] == list(range(1, len(rec.events) + 1))
