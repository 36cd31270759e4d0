"""Preemption: a row leaves the batch when the KV budget has no block for the rows that need
one (kv/reserve.py chooses which), and comes back where it stopped.

A preempted row is parked: its KV (prompt and the tokens written so far) goes to the RAM
prompt cache as a finished row's does (Batch.park), its submission goes back to the front of
the queue, and its Row (tokens sent, text and stop-string state, sampler, processors, counts)
waits beside it. Resumed, it is inserted again as prompt plus tokens so far, from the longest
prefix the cache still holds: the whole of it, or less (evicted meanwhile, a cache that
cannot be trimmed, no cache), the rest being prefilled again, as vLLM recomputes. Its first
token after that is the one it would have written next; nothing already sent is sent again.

Preempted only between steps, where a row's state is whole: the batch has already drawn its
next token (not sent yet) and the resumption draws it again, from the same context. So a
seeded row's key is put back by that one draw, and a row's own logits processors must follow
the context by position, taking in only what is new since their last call (a grammar's, a
thinking budget's: they say so with `resumable = True`); a row with any other processor is
never preempted, and is counted at its whole length from admission instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlxd.worker.engine.rows import Row, Submission

if TYPE_CHECKING:  # no MLX at import time: `resumable` is unit-tested without it
    from mlxd.worker.engine.batch import Batch


def resumable(sub: Submission) -> bool:
    """Whether a row of `sub` may be preempted and resumed with the same output."""
    return all(getattr(p, "resumable", False) for p in sub.processors)


def park(batch: Batch, row: Row) -> None:
    """Take `row` out of the batch to resume later (its KV to the prompt cache)."""
    sampling = getattr(row.sampler, "sampling", None)  # the row's RowSampling
    drawn = row.started and row.todo == 0 and not row.sent_ahead
    if drawn and getattr(sampling, "key", None) is not None:
        # Its next token is drawn already, not sent: the resumption draws it again, from
        # this key. (One sent ahead is among the tokens the resumption starts from.)
        sampling.key = sampling.prev_key  # type: ignore[union-attr]
    batch.park(row)


def resume(batch: Batch, row: Row) -> Row:
    """Insert a parked `row` into the batch again: prompt plus the tokens it sent, from the
    prompt cache's longest prefix of them. Raises on an MLX error (this row only)."""
    layers, n = None, 0
    if batch.cache is not None:
        layers, n, _ = batch.cache.fetch(row.sub.ns, [*row.sub.prompt, *row.tokens])
    batch.reinsert(row, layers, n)
    return row
