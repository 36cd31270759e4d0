"""Keep one row's failure that row's: per-row guards, and who to blame when a step fails.

The engine runs every row of the batch in one step, so an exception from a row's own code
(its sampler, a grammar) would fail the step for all of them. The guards catch such an
exception inside the step, note the row, and let the step finish. What escapes them anyway
(an MLX error at evaluation time) fails the step; `rebuild` then makes a fresh batch, and
`blame` says which rows to fail and which to carry over into it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from mlxd.shared.errors import Unavailable
from mlxd.worker.engine.rows import Event, Row, Submission, not_decoding
from mlxd.worker.engine.sched.oom import split_after_oom

if TYPE_CHECKING:  # no MLX at import time: `blame` is unit-tested without it
    from mlxd.worker.engine.batch import Batch

log = logging.getLogger("mlxd.worker.engine.loop")

# (submission, exception) pairs the guards noted during a step; the engine fails those rows.
Broken = list[tuple[Submission, Exception]]


# How MLX words an allocation it could not make: its allocators' "[malloc] Unable to allocate
# N bytes.", Metal's "[metal::malloc] Attempting to allocate N bytes which is greater than the
# maximum allowed buffer size ..." (one buffer too large: a smaller prefill chunk fits) and
# "Resource limit (N) exceeded.", a command buffer's "Insufficient Memory", CUDA's "out of
# memory".
OOM_MARKERS = (
    "unable to allocate",
    "greater than the maximum allowed buffer size",
    "resource limit",
    "insufficient memory",
    "out of memory",
)


def is_out_of_memory(exc: BaseException | None) -> bool:
    """Whether `exc` is MLX failing to allocate (a RuntimeError naming it)."""
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MARKERS)


def generation_failed(rid: str, exc: BaseException | None = None) -> Unavailable:
    """What the client hears: a plain sentence; the exception itself goes to the log only.
    An allocation failure says so: retrying later, or shorter, may fit."""
    if is_out_of_memory(exc):
        return Unavailable(
            "The worker ran out of memory for this request; retry later or with a shorter "
            f"prompt or max_tokens (request {rid})",
            code="out_of_memory",
            retry_after_s=1.0,
        )
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


class GuardedSampler:
    """A row's sampler that raises fails that row only; the step gets a greedy token."""

    def __init__(self, sub: Submission, sampler: Callable, broken: Broken):
        self._sub, self._sampler, self._broken = sub, sampler, broken
        self.sampling = getattr(sampler, "sampling", sampler)  # what the decode batch reads

    def __call__(self, logprobs):
        try:
            return self._sampler(logprobs)
        except Exception as exc:
            log.exception("sampler of %s failed", self._sub.rid)
            self._broken.append((self._sub, exc))
            return logprobs.argmax(axis=-1)


def guard_sampler(sub: Submission, sampler: Callable, broken: Broken) -> GuardedSampler:
    """`sampler`, guarded (GuardedSampler)."""
    return GuardedSampler(sub, sampler, broken)


def blame(rows: list[Row], broken: Broken) -> tuple[list[Row], list[Row]]:
    """(rows to fail, rows to resume) after a step failed with an exception.

    A row a guard caught is to blame. Otherwise the suspects are the rows that have not been
    through a decode step yet: rows already decoding went through sampling at least once,
    while a new row meets its parameters and its first sampling in this step (its first
    token, drawn in the step before, may have gone out already: emit.send_first). When
    every row is decoding the cause cannot be told apart and all of them fail (resuming them
    could fail the same way).
    Rows with their own logits processors cannot be resumed (a grammar's state cannot be
    rewound to the tokens the client has seen) and fail with the culprits, as do rows
    resumed once already: a row present at two failed steps is not carried over again, so
    a row that keeps failing the batch cannot keep getting newcomers blamed.
    """
    noted = {id(sub) for sub, _ in broken}
    culprits = [r for r in rows if id(r.sub) in noted] or [r for r in rows if not_decoding(r)]
    if not culprits:
        return list(rows), []
    blamed = {id(r) for r in culprits}
    others = [r for r in rows if id(r) not in blamed]
    stay = [r for r in others if not r.sub.processors and not r.resumed]
    kept = {id(r) for r in stay}
    return culprits + [r for r in others if id(r) not in kept], stay


def rebuild(
    batch: Batch,
    make_generator: Callable,
    exc: BaseException | None = None,
    keep_all: bool = False,
    wait: Callable[[list[Row], list[Row]], None] | None = None,
) -> None:
    """A step failed: start a fresh batch, fail the rows to blame, resume the others
    (`keep_all`: no one is to blame, e.g. a prefill out of memory retried in smaller chunks;
    rows with their own processors still fail, as their state cannot be rewound). After an
    allocation failure, rows that may wait for room (sched/oom.py) are handed to `wait`
    (oldest first, with the rows that stayed) instead of failing.

    A failed step leaves mlx-lm's batch half-updated (every later step fails with "eval
    an array without a primitive"), so nothing of it is kept: resumed rows prefill their
    prompt and the tokens already sent again. If even a fresh batch cannot be made, the
    exception stops the engine thread and /health reports the engine dead.
    """
    fail, resume = blame(list(batch.rows.values()), batch.broken)
    if keep_all and not batch.broken:
        rows = fail + resume
        fail = [r for r in rows if r.sub.processors]
        resume = [r for r in rows if not r.sub.processors]
    noted = {id(sub) for sub, _ in batch.broken}  # rows a guard caught: to blame, never wait
    batch.broken.clear()
    waiting: list[Row] = []
    if is_out_of_memory(exc):  # give back what the failed step's buffers still hold
        import mlx.core as mx  # here: `blame` is unit-tested without MLX

        mx.clear_cache()
        if wait is not None and not keep_all:
            fail, resume, waiting = split_after_oom(fail, resume, noted)
    # Close first: a generator restores the wired-memory limit it found at creation, so the
    # new one must be made after the old one put the system's back.
    try:
        batch.generator().close()
    except Exception:
        log.exception("closing the failed batch failed")
    batch.gen = make_generator()
    batch.recoveries += 1
    log.warning(
        "rebuilt the batch after a failed step: failing %s; resuming %s; waiting for room %s",
        [r.sub.rid for r in fail] or "none",
        [r.sub.rid for r in resume] or "none",
        [r.sub.rid for r in waiting] or "none",
    )
    batch.rows.clear()  # the old uids mean nothing to the new batch
    for row in (*waiting, *resume):
        sampling = getattr(row.sampler, "sampling", None)  # the row's RowSampling
        if sampling is not None:
            sampling.rewind(row.generated)
    for row in waiting:
        batch.release(row)
    if waiting and wait is not None:
        wait(waiting, resume)
    for row in fail:
        batch.finish(row)
        row.sub.sink(failure(row, exc))
    for row in resume:
        was = row.resumed
        try:
            batch.resume(row)
            if keep_all:  # not the row's doing: blame() may still carry it over later
                row.resumed = was
        except Exception as again:
            log.exception("resuming %s failed", row.sub.rid)
            batch.finish(row)
            row.sub.sink(failure(row, again))


def failure(row: Row, exc: BaseException | None = None) -> Event:
    """The last event of a row that failed with the step (`exc`: the step's exception)."""
    return Event.failure(generation_failed(row.sub.rid, exc), row.generated)
