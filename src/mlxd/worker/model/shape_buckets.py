"""Causal attention in a few shapes (CUDA): rows extending cached prefixes stop paying
a cuDNN graph build per history length.

cuDNN builds (and caches) a graph for each (rows, queries, keys) shape it meets; a row that
extends a cached prefix attends `n` new queries over `L` keys, and `L` is the session's own
history length, new at every turn: each such row paid a build (0.59 s of a 1.01 s first token
for 8 sessions on the H200's 8B shape; docs/benchmarks.md, 2026-12-05). Here the call is
padded to bucketed sizes instead, so that every session whose length falls in a bucket reuses
one graph:

- keys: `L` rounded up to `key_bucket(L, n)` (8 buckets an octave, finer where n is small:
  at most 1/8 more keys and fewer than twice n), the `dk` added keys zeros after the real ones;
- queries: `n + dk` rounded up to a power of two, the real queries placed so that MLX's causal
  mask (aligned to the end of the keys) lets query `j` see exactly keys `0 .. L - n + j`:
  `f` dummy queries before them, `dk` after (those alone see the added keys). Dummies' outputs
  are dropped.

So the result is the unpadded causal call's, row for row (tests/integration/
test_shape_buckets.py); the cost is attention over the padding (at most 1/8 more keys, up to
four times the queries, 2.3x on average over agent-like sizes, while the projections and MLP
see none of it) and a copy of the row's keys and values per layer. Measured on an H100
(docs/benchmarks.md, 2026-12-06, `bench extend`, rows extending a cached 6k prefix, lengths
new every repeat): 8 rows of the 8B shape reached their first tokens in 0.32-0.36 s against
0.74-0.79 s unpadded, the 0.6B's in 0.24 against 0.54 s; 4 rows about even. On by default
(the worker's `attention_buckets`, set at load by `set_on`); read only where attention.py
routes calls, i.e. CUDA: Metal and the CPU build nothing per shape.
"""

from __future__ import annotations

import mlx.core as mx

on = False
PER_OCTAVE = 8  # key buckets in each power of two: at most 1/8 of the keys added
MIN_KEYS = 64


def set_on(value: bool) -> None:
    global on
    on = bool(value)


def key_bucket(n: int, queries: int = 0) -> int:
    """`n` keys rounded up to a bucket: a multiple of 1/PER_OCTAVE of n's power of two, or of
    the power of two at or above `queries` where that is smaller (so the keys added, which the
    queries must cover, at most double the queries)."""
    step = (1 << (max(n, 1).bit_length() - 1)) // PER_OCTAVE
    if queries > 0:
        step = min(step, query_bucket(queries))
    step = max(MIN_KEYS, step)
    return -(-n // step) * step


def query_bucket(n: int) -> int:
    """`n` queries rounded up to a power of two."""
    return 1 << (max(n, 1) - 1).bit_length()


def plan(n: int, keys: int) -> tuple[int, int, int]:
    """(dummy queries before, dummy queries after, padded key count) for `n` queries over
    `keys` keys, causal and aligned to the end; the padded query count is their sum plus n."""
    padded_keys = key_bucket(keys, n)
    added = padded_keys - keys
    queries = query_bucket(n + added)
    if queries > padded_keys:  # a nearly fresh prompt: keep the real query count
        queries = n + added
    return queries - n - added, added, padded_keys


def causal(fused, q: mx.array, k: mx.array, v: mx.array, scale: float) -> mx.array:
    """`fused(q, k, v, scale=scale, mask="causal")` with q's queries and k's keys padded to
    bucketed counts (above); the same result as the unpadded call."""
    n = q.shape[2]
    before, after, padded_keys = plan(n, k.shape[2])
    if n > k.shape[2] or before == 0 and after == 0:  # queries seeing no key: as they come
        return fused(q, k, v, scale=scale, mask="causal")
    q = mx.pad(q, [(0, 0), (0, 0), (before, after), (0, 0)])  # zeros
    k, v = (mx.pad(x, [(0, 0), (0, 0), (0, after), (0, 0)]) for x in (k, v))
    assert k.shape[2] == padded_keys
    out = fused(q, k, v, scale=scale, mask="causal")
    return out[:, :, before : before + n]
