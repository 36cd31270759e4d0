"""Keep one row's failure that row's: per-row guards, and who to blame when a step fails.

The engine runs every row of the batch in one step, so an exception from a row's own code
(its sampler, a grammar) would fail the step for all of them. The guards catch such an
exception inside the step, note the row, and let the step finish. What escapes them anyway
(an MLX error at evaluation time) fails the step; the engine then rebuilds its batch state
and `blame` says which rows to fail and which to carry over into the new batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from mlxd.shared.errors import Unavailable

if TYPE_CHECKING:  # no MLX at import time: `blame` is unit-tested without it
    from mlxd.worker.engine.rows import Row, Submission

log = logging.getLogger("mlxd.worker.engine.loop")

# (submission, exception) pairs the guards noted during a step; the engine fails those rows.
Broken = list[tuple["Submission", Exception]]


def generation_failed(rid: str) -> Unavailable:
    """What the client hears: a plain sentence; the exception itself goes to the log only."""
    return Unavailable(
        f"Generation failed for this request; the worker log has the details (request {rid})"
    )


def guard_processor(sub: Submission, processor: Callable, broken: Broken) -> Callable:
    """A request's own logits processor (a grammar) that raises fails that row only."""

    def run(tokens, logits):
        try:
            return processor(tokens, logits)
        except Exception as exc:
            log.exception("logits processor of %s failed", sub.rid)
            broken.append((sub, exc))
            return logits

    return run


def guard_sampler(sub: Submission, sampler: Callable, broken: Broken) -> Callable:
    """A row's sampler that raises fails that row only; the step gets a greedy token."""

    def run(logprobs):
        try:
            return sampler(logprobs)
        except Exception as exc:
            log.exception("sampler of %s failed", sub.rid)
            broken.append((sub, exc))
            return logprobs.argmax(axis=-1)

    return run


def blame(rows: list[Row], broken: Broken) -> tuple[list[Row], list[Row]]:
    """(rows to fail, rows to resume) after a step failed with an exception.

    A row a guard caught is to blame. Otherwise the suspects are the rows that have produced
    no token yet: rows already decoding went through sampling at least once, while a new row
    meets its parameters and its first sampling in this step. When every row is decoding the
    cause cannot be told apart and all of them fail (resuming them could fail the same way).
    Rows with their own logits processors cannot be resumed (a grammar's state cannot be
    rewound to the tokens the client has seen) and fail with the culprits, as do rows
    resumed once already: a row present at two failed steps is not carried over again, so
    a row that keeps failing the batch cannot keep getting newcomers blamed.
    """
    noted = {id(sub) for sub, _ in broken}
    culprits = [r for r in rows if id(r.sub) in noted] or [r for r in rows if r.generated == 0]
    if not culprits:
        return list(rows), []
    blamed = {id(r) for r in culprits}
    others = [r for r in rows if id(r) not in blamed]
    stay = [r for r in others if not r.sub.processors and not r.resumed]
    kept = {id(r) for r in stay}
    return culprits + [r for r in others if id(r) not in kept], stay
