"""Preemption: a row leaves the batch when the KV budget has no block for the rows that need
one (kv/reserve.py chooses which), and comes back where it stopped.

A preempted row is parked: its KV (prompt and the tokens written so far) goes to the RAM
prompt cache as a finished row's does (Batch.park), its submission goes back to the front of
the queue, and its Row (tokens sent, text and stop-string state, sampler, processors, counts)
waits beside it. Resumed, it is inserted again as prompt plus tokens so far, from the longest
prefix the cache still holds: the whole of it, or less (evicted meanwhile, a cache that
cannot be trimmed, no cache), the rest being prefilled again, as vLLM recomputes. Its first
token after that is the one it would have written next; nothing already sent is sent again.

Resumable rows: no logits processors of their own (a grammar's or a thinking budget's state
cannot be rewound to the tokens the client has seen) and no seeded sampling (the batch has
already drawn the row's next token from its key, a draw a resumption would make again with
the key one split further): those are counted at their whole length from admission instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlxd.worker.engine.rows import Row, Submission

if TYPE_CHECKING:  # no MLX at import time: `resumable` is unit-tested without it
    from mlxd.worker.engine.batch import Batch


def resumable(sub: Submission) -> bool:
    """Whether a row of `sub` may be preempted and resumed with the same output."""
    p = sub.params
    seeded = p.seed is not None and bool(p.temperature)
    return not sub.processors and not seeded


def resume(batch: Batch, row: Row) -> Row:
    """Insert a parked `row` into the batch again: prompt plus the tokens it sent, from the
    prompt cache's longest prefix of them. Raises on an MLX error (this row only)."""
    sub = row.sub
    seq = [*sub.prompt, *row.tokens]
    layers, n = None, 0
    if batch.cache is not None:
        layers, n, _ = batch.cache.fetch(sub.ns, seq)
    max_tokens = sub.params.max_tokens
    assert max_tokens is not None  # resolve_params fixed it before the submission
    assert batch.eos is not None  # set with the generator
    row.uid = batch.generator().insert_segments(
        [[seq[n:]]],
        max_tokens=[max(1, max_tokens - row.generated)],
        # mlx-lm fills a None entry with fresh caches (its own default)
        caches=[layers],  # type: ignore[list-item]
        all_tokens=[seq[:n]],
        samplers=[row.sampler],
        logits_processors=[row.processors],
        stop_sequences=[batch.eos],
    )[0]
    row.pos, row.todo, row.started = n, len(seq) - n - 1, False
    batch.add(row)
    return row
