"""The caches an entry of the prompt cache holds: made compact to keep (exactly their tokens,
windows no longer than their window), viewed at a length to hand to a batch, and how much of
them a prompt can reuse. Split from ram.py, which indexes and bounds the entries."""

from __future__ import annotations

import copy

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    trim_prompt_cache,
)

from mlxd.worker.kv.layers import plain_only


def usable_length(
    tokens_len: int, common: int, prompt_len: int, trimmable: bool, exact_prefix: bool
) -> int:
    """How many cached tokens a prompt can reuse: at least one prompt token must stay to run."""
    if exact_prefix and tokens_len < prompt_len:
        return tokens_len
    if not trimmable:
        return 0
    return min(common, prompt_len - 1)


def view(layers: list, length: int, full: int) -> list:
    """Caches holding the first `length` tokens, safe to hand to a batch (never mutated)."""
    if plain_only(layers):
        out = []
        for c in layers:
            v = KVCache()
            v.keys, v.values, v.offset = c.keys, c.values, length
            out.append(v)
        return out
    if all(isinstance(c, QuantizedKVCache) for c in layers):
        # The same arrays at a shorter offset: a batch's merge copies them, never writes them.
        views = []
        for c in layers:
            q = copy.copy(c)
            q.offset = length
            views.append(q)
        return views
    out = copy.deepcopy(layers)
    if length < full:
        trim_prompt_cache(out, full - length)
    return out


def compact(layers: list) -> list:
    """`layers` in buffers of their own, exactly their tokens long (evaluated).

    A finished row's cache is a slice of the row's buffer (256-token steps, or the batch's
    arrays): kept as is, it would hold the whole buffer while `nbytes` counts the slice."""
    out = [_compact(c) for c in layers]
    mx.eval([c.state for c in out])
    return out


def _compact(c):
    if type(c) is KVCache or isinstance(c, QuantizedKVCache):
        if c.keys is None:
            return c
        q = copy.copy(c)
        q.keys, q.values = tree_map(
            lambda x: mx.contiguous(x[..., : c.offset, :]), (c.keys, c.values)
        )
        return q
    if isinstance(c, ArraysCache):
        a = copy.copy(c)
        a.cache = [None if x is None else mx.contiguous(x) for x in c.cache]
        return a
    if isinstance(c, CacheList):
        return CacheList(*(_compact(x) for x in c.caches))
    if type(c) is RotatingKVCache:
        return window_only(c)
    return c


def window_only(c: RotatingKVCache) -> RotatingKVCache:
    """A sliding window holding no more than its window (`keep` first, then the newest).

    A chunked prefill leaves `window - 1 + chunk` positions in time order (5119 for a 1024
    window and 4096-token chunks): mlx-lm's next update trims them to `keep` + the newest
    before any use and BatchRotatingKVCache.merge copies only those, so the rest is dead bytes
    that RAM would count and the SSD tier would write and read back (issue 34)."""
    keys, values, offset, keep, window, at = c.state
    held = 0 if keys is None else keys.shape[2]
    if held <= window or at != held:  # within its window, or wrapped (then exactly full)
        return c
    cut = held - window

    def trim(x: mx.array) -> mx.array:
        return mx.contiguous(mx.concatenate([x[..., :keep, :], x[..., cut + keep :, :]], axis=2))

    r = RotatingKVCache(max_size=window, keep=keep)
    r.state = (trim(keys), trim(values), offset, keep, window, window)
    return r
