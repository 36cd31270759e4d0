"""After an allocation failure, who waits for room instead of failing (engine/sched/oom.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxd.worker.engine.recovery import blame
from mlxd.worker.engine.sched.oom import MAX_WAITS, split_after_oom


class _Resumable:
    resumable = True  # a grammar that follows the context by position


@dataclass(eq=False)
class _Sub:
    rid: str
    processors: list = field(default_factory=list)
    oom_waits: int = 0


@dataclass(eq=False)
class _Row:
    sub: _Sub
    generated: int = 0
    seq: int = 0
    resumed: bool = False


def row(rid, generated=0, seq=0, **sub):
    return _Row(_Sub(rid, **sub), generated, seq)


def rids(rows):
    return [r.sub.rid for r in rows]


def split(rows):
    return split_after_oom(*blame(rows, []))


def test_a_newcomer_waits_while_the_decoding_rows_go_on():
    old, new = row("old", 12, seq=0), row("new", 0, seq=1)
    fail, stay, wait = split([old, new])
    assert (rids(fail), rids(stay), rids(wait)) == ([], ["old"], ["new"])


def test_newcomers_wait_oldest_first():
    rows = [row("d", 5, seq=0), row("n2", seq=2), row("n1", seq=1)]
    assert rids(split(rows)[2]) == ["n1", "n2"]


def test_a_lone_newcomer_has_nothing_smaller_to_wait_for_and_fails():
    fail, stay, wait = split([row("alone")])
    assert (rids(fail), stay, wait) == (["alone"], [], [])


def test_all_decoding_the_older_half_goes_on_and_the_newer_half_waits():
    rows = [row(f"r{i}", 10 - i, seq=i) for i in (3, 0, 2, 1, 4)]
    fail, stay, wait = split(rows)
    assert (rids(fail), sorted(rids(stay)), rids(wait)) == ([], ["r0", "r1", "r2"], ["r3", "r4"])


def test_a_lone_decoding_row_is_carried_over_once_then_fails():
    only = row("only", 7)
    fail, stay, wait = split([only])
    assert (fail, rids(stay), wait) == ([], ["only"], [])
    only.resumed = True  # what the rebuild's carry-over marks
    fail, stay, wait = split([only])
    assert (rids(fail), stay, wait) == (["only"], [], [])


def test_rows_that_cannot_be_resumed_or_waited_twice_fail():
    opaque = row("opaque", seq=1, processors=[object()])  # state cannot be rewound
    grammar = row("grammar", seq=2, processors=[_Resumable()])
    tired = row("tired", seq=3, oom_waits=MAX_WAITS)
    fail, stay, wait = split([row("d", 4, seq=0), opaque, grammar, tired])
    assert (rids(fail), rids(stay), rids(wait)) == (["opaque", "tired"], ["d"], ["grammar"])


def test_all_decoding_a_row_carried_over_once_already_fails_and_the_next_oldest_stay():
    again = row("again", 9, seq=0)
    again.resumed = True
    fail, stay, wait = split([again, row("b", 8, seq=1), row("c", 7, seq=2), row("d", 6, seq=3)])
    assert (rids(fail), rids(stay), rids(wait)) == (["again"], ["b", "c"], ["d"])


def test_a_row_a_guard_caught_fails_even_when_the_step_also_ran_out_of_memory():
    # Its own grammar raised (the guard noted it) and the step then failed to allocate: it
    # is to blame, as blame() says, and is not sent back as a newcomer would be.
    bad, ok = row("bad", 5, seq=1, processors=[_Resumable()]), row("ok", 9, seq=0)
    broken = [(bad.sub, ValueError("grammar"))]
    fail, stay, wait = split_after_oom(*blame([ok, bad], broken), {id(bad.sub)})
    assert (rids(fail), rids(stay), rids(wait)) == (["bad"], ["ok"], [])


def test_all_decoding_the_oldest_rows_that_may_stay_do_when_older_ones_may_not():
    old = row("old", 30, seq=0)
    old.resumed = True  # carried over a failed step once already
    back = row("back", 10, seq=1, oom_waits=1)
    fail, stay, wait = split([old, back])
    assert (rids(fail), rids(stay), wait) == (["old"], ["back"], [])


def test_the_admission_cap_lifts_once_every_row_that_stayed_has_left():
    from types import SimpleNamespace

    from mlxd.shared.params import GenerationParams
    from mlxd.worker.engine.rows import Submission
    from mlxd.worker.engine.sched.planner import PlanConfig
    from mlxd.worker.engine.sched.schedule import Scheduler

    def sub(rid):
        return Submission(rid, [1, 2], GenerationParams(max_tokens=4), lambda ev: None)

    batch = SimpleNamespace(rows={})
    sched = Scheduler(batch, 4, PlanConfig(), None)  # type: ignore[arg-type]
    a, b, w = (SimpleNamespace(sub=sub(x), generated=3) for x in "abw")
    sched.wait_after_oom([w], [a, b])
    assert sched.oom_rows == 2 and list(sched.waiting) == [w.sub] and w.sub.oom_waits == 1
    batch.rows = {1: b, 2: SimpleNamespace(sub=sub("c"))}  # "a" left, "c" came in
    sched.waiting.clear()
    sched.admit(tokenizer=None)
    assert sched.oom_rows == 2  # "b" is still there
    batch.rows = {2: SimpleNamespace(sub=batch.rows[2].sub)}  # "b" left too
    sched.admit(tokenizer=None)
    assert sched.oom_rows is None and not sched.oom_stayed
