"""After a step ran out of memory: which rows wait for room instead of failing.

`recovery.blame` names the rows to fail after a failed step: the newcomers (no token yet),
or every row when all of them were decoding. For an allocation failure that is too harsh:
the memory was short for the batch as a whole (another process on the GPU, a plan that
counted on more than the device had), not poisoned by one request. So, once halving the
prefill chunk no longer helps (Scheduler.shrink_prefill):

- a newcomer waits at the front of the queue while the rows that stay carry on, and joins
  when the batch is smaller (at most `MAX_WAITS` times; then it fails as before);
- when every row was decoding, the older half carries on and the newer half waits, to be
  resumed where it stopped (sched/preempt.py: nothing already sent is sent again).

Until the rows that stayed have all left, the scheduler runs no more rows at once than
stayed (Scheduler.wait_after_oom): the memory that failed the others is not there yet. A
lone row out of memory is carried over once (a fresh batch, MLX's buffer cache emptied),
then fails. Rows with their own logits
processors that cannot follow a resumption (`preempt.resumable`), rows carried over a failed
step once already, and a worker group's rows (its ranks must admit alike) fail as before.
"""

from __future__ import annotations

from mlxd.worker.engine.rows import Row, not_decoding
from mlxd.worker.engine.sched.preempt import resumable

MAX_WAITS = 2  # times one request may be sent back to the queue by allocation failures


def may_wait(row: Row) -> bool:
    return resumable(row.sub) and not row.resumed and row.sub.oom_waits < MAX_WAITS


def may_stay(row: Row) -> bool:
    """What `blame` carries over: no processors of its own, not carried over before."""
    return not row.sub.processors and not row.resumed


def split_after_oom(
    fail: list[Row],
    stay: list[Row],
    noted: set[int] = frozenset(),  # type: ignore[assignment]
) -> tuple[list[Row], list[Row], list[Row]]:
    """(fail, stay, wait) from blame's (fail, stay) after an allocation failure; `wait` in
    admission order (the oldest first). `noted`: ids of the submissions a guard caught in
    the step (their own code raised): they fail, as blame says."""
    if not stay and fail and not any(not_decoding(r) for r in fail):
        # Every row was decoding: the oldest that may carry on do, up to half of the rows.
        eligible = sorted((r for r in fail if may_stay(r) and id(r.sub) not in noted), key=_age)
        stay = eligible[: (len(fail) + 1) // 2]
        kept = {id(r) for r in stay}
        fail = [r for r in fail if id(r) not in kept]
    if not stay:  # nothing smaller to wait for: the batch was one row, or none may stay
        return fail, stay, []
    wait = sorted((r for r in fail if may_wait(r) and id(r.sub) not in noted), key=_age)
    waiting = {id(r) for r in wait}
    return [r for r in fail if id(r) not in waiting], stay, wait


def _age(row: Row) -> int:
    return row.seq
