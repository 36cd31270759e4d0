"""Quantized KV for batches: mlx-lm's QuantizedKVCache has no batch form, this is ours.

A model whose config sets `kv_bits` makes these row caches (scheme.py). A row cache merges
into a BatchQuantizedKVCache, which has what mlx-lm's BatchKVCache has (left padding,
prepare/finalize for right-padded prefill, filter, extend, extract, trim, make_mask) over
(packed, scales, biases) triples; its `bits` attribute sends mlx-lm's attention down its
quantized path (models/base.py).
"""

from __future__ import annotations

from typing import cast

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import (
    KVCache,
    QuantizedKVCache,
    _BaseCache,
    dynamic_roll,
)


class QuantizedRowCache(QuantizedKVCache):
    """mlx-lm's QuantizedKVCache that a batch can merge (and that knows its size)."""

    def size(self) -> int:
        return self.offset

    @classmethod
    def merge(cls, caches):
        return BatchQuantizedKVCache.merge(caches)


def head(c: KVCache | QuantizedKVCache, n: int) -> KVCache | QuantizedRowCache:
    """A row cache of `c`'s first `n` positions, of `c`'s kind (a view: `c` may go on)."""
    out: KVCache | QuantizedRowCache = (
        QuantizedRowCache(group_size=c.group_size, bits=c.bits)
        if isinstance(c, QuantizedKVCache)
        else KVCache()
    )
    if c.keys is not None:
        out.keys, out.values = tree_map(lambda x: x[..., :n, :], (c.keys, c.values))
        out.offset = n
    return out


def _quantized(c, group_size: int, bits: int):
    """(keys, values) triples of a row cache up to its offset, quantizing a plain one."""
    if c.keys is None or c.offset == 0:
        return None
    if isinstance(c, QuantizedKVCache):
        if (c.bits, c.group_size) != (bits, group_size):
            raise ValueError(f"a {c.bits}-bit row cannot join a {bits}-bit batch")
        return tree_map(lambda x: x[..., : c.offset, :], (c.keys, c.values))
    k, v = c.keys[..., : c.offset, :], c.values[..., : c.offset, :]
    q = mx.quantize(k, group_size=group_size, bits=bits)
    return tuple(q), tuple(mx.quantize(v, group_size=group_size, bits=bits))


class BatchQuantizedKVCache(_BaseCache):
    """Left-padded rows of quantized K and V, as mlx-lm's BatchKVCache holds float ones."""

    step = 256

    def __init__(self, left_padding: list[int], group_size: int = 64, bits: int = 8):
        self.keys: tuple | None = None  # (packed uint32, scales, biases), each (B, H, L, d)
        self.values: tuple | None = None
        self.group_size, self.bits = group_size, bits
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self._idx = 0
        self._right_padding: mx.array | None = None

    # -- what attention calls -------------------------------------------------------------
    def update_and_fetch(self, keys, values):
        n = keys.shape[2]
        prev = self._idx
        if self.keys is None or prev + n > self.keys[0].shape[2]:
            self._grow(keys, values, n)
        qk = mx.quantize(keys, group_size=self.group_size, bits=self.bits)
        qv = mx.quantize(values, group_size=self.group_size, bits=self.bits)
        self._idx += n
        self.offset = self.offset + n
        for i in range(3):
            self.keys[i][..., prev : self._idx, :] = qk[i]
            self.values[i][..., prev : self._idx, :] = qv[i]
        return self.keys_and_values()

    def _grow(self, keys, values, n: int) -> None:
        B, H = keys.shape[:2]
        steps = (self.step + n - 1) // self.step * self.step
        per_int = 32 // self.bits

        def blank(dim, dtype):
            shape = (B, H, steps)
            return (
                mx.zeros((*shape, dim // per_int), dtype=mx.uint32),
                mx.zeros((*shape, dim // self.group_size), dtype=dtype),
                mx.zeros((*shape, dim // self.group_size), dtype=dtype),
            )

        new_k, new_v = blank(keys.shape[3], keys.dtype), blank(values.shape[3], values.dtype)
        if self.keys is None:
            self.keys, self.values = new_k, new_v
            return
        idx = self._idx

        def cat(old, new):
            return tuple(mx.concatenate([o[..., :idx, :], x], axis=2) for o, x in zip(old, new))

        self.keys, self.values = cat(self.keys, new_k), cat(self.values, new_v)

    def keys_and_values(self):
        return tree_map(lambda x: x[..., : self._idx, :], (self.keys, self.values))

    def make_mask(self, N: int, return_array: bool = False, **kwargs):
        return create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)

    # -- prefill of right-padded prompts (as BatchKVCache) --------------------------------
    def prepare(self, *, left_padding=None, lengths=None, right_padding=None):
        if left_padding is not None:
            if self.keys is not None:
                raise ValueError("left padding can only be added to an empty cache")
            lp = mx.array(left_padding)
            self.left_padding = self.left_padding + lp
            self.offset = self.offset - lp
        if right_padding is not None and max(right_padding) > 0:
            self._right_padding = mx.array(right_padding)

    def finalize(self):
        if self._right_padding is None:
            return
        pad = self._right_padding
        self.keys, self.values = tree_map(
            lambda x: dynamic_roll(x, pad[:, None], axis=2), (self.keys, self.values)
        )
        self.offset = self.offset - pad
        self.left_padding = self.left_padding + pad
        self._right_padding = None

    # -- the rows -------------------------------------------------------------------------
    def filter(self, batch_indices):
        """Keep only the rows at `batch_indices` (in place), dropping padding all share."""
        if self.keys is not None:
            self.keys, self.values = tree_map(lambda x: x[batch_indices], (self.keys, self.values))
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        shift = min(self.left_padding.tolist())
        if shift > 0:
            if self.keys is not None:
                self.keys, self.values = tree_map(
                    lambda x: x[..., shift:, :], (self.keys, self.values)
                )
            self._idx -= shift
            self.left_padding = self.left_padding - shift

    def extend(self, other: BatchQuantizedKVCache) -> None:
        """Append `other`'s rows (in place), right-aligned at the longer of the two."""
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        ref = self if self.keys is not None else other
        idx = max(self._idx, other._idx)
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)

        def pad(c):
            if c.keys is None:
                b = c.offset.shape[0]
                kv = tuple(
                    tuple(mx.zeros((b, x.shape[1], 0, x.shape[3]), x.dtype) for x in t)
                    for t in (ref.keys, ref.values)
                )
            else:
                kv = c.keys, c.values
            left = idx - c._idx
            right = size - kv[0][0].shape[2] - left

            def one(x):
                if right < 0:
                    x = x[..., :right, :]
                if left or right > 0:
                    x = mx.pad(x, [(0, 0), (0, 0), (left, max(0, right)), (0, 0)])
                return x

            return tree_map(one, kv), c.offset, c.left_padding + left

        (k1, v1), o1, l1 = pad(self)
        (k2, v2), o2, l2 = pad(other)
        self.keys = tuple(mx.concatenate([a, b]) for a, b in zip(k1, k2))
        self.values = tuple(mx.concatenate([a, b]) for a, b in zip(v1, v2))
        self.offset, self.left_padding = mx.concatenate([o1, o2]), mx.concatenate([l1, l2])
        self._idx = idx

    def extract(self, idx: int) -> QuantizedRowCache:
        """Row `idx` alone, compact (exactly its tokens), as a plain quantized cache."""
        c = QuantizedRowCache(group_size=self.group_size, bits=self.bits)
        # cast: mlx's stub types tolist() as list or scalar; left_padding is 1-D
        pad = cast(list[int], self.left_padding.tolist())[idx]
        if self.keys is not None and self._idx > pad:
            c.keys, c.values = tree_map(
                lambda x: mx.contiguous(x[idx : idx + 1, :, pad : self._idx]),
                (self.keys, self.values),
            )
            c.offset = self._idx - pad
        return c

    @classmethod
    def merge(cls, caches) -> BatchQuantizedKVCache:
        """One batch cache of row caches (quantized ones, or plain ones to quantize)."""
        q = next((c for c in caches if isinstance(c, QuantizedKVCache)), None)
        gs, bits = (q.group_size, q.bits) if q is not None else (64, 8)
        parts = [_quantized(c, gs, bits) for c in caches]
        lengths = [0 if p is None else p[0][0].shape[2] for p in parts]
        longest = max(lengths)
        cache = cls([longest - n for n in lengths], group_size=gs, bits=bits)
        if longest == 0:
            return cache
        ref = next(p for p in parts if p is not None)

        def blank(x):
            return mx.zeros((len(caches), x.shape[1], longest, x.shape[3]), dtype=x.dtype)

        keys, values = [blank(x) for x in ref[0]], [blank(x) for x in ref[1]]
        for i, (p, n) in enumerate(zip(parts, lengths)):
            if p is None:
                continue
            for j in range(3):
                keys[j][i : i + 1, :, longest - n :] = p[0][j]
                values[j][i : i + 1, :, longest - n :] = p[1][j]
        cache.keys, cache.values = tuple(keys), tuple(values)
        cache.offset = cache.offset + longest
        cache._idx = longest
        return cache

    # -- bookkeeping ----------------------------------------------------------------------
    @property
    def state(self):
        return self.keys, self.values, self.offset, self.left_padding

    @state.setter
    def state(self, v):
        self.keys, self.values, self.offset, self.left_padding = v
        self._idx = 0 if self.keys is None else self.keys[0].shape[2]

    @property
    def meta_state(self):
        return tuple(map(str, (self._idx, self.group_size, self.bits)))

    @meta_state.setter
    def meta_state(self, v):
        self._idx, self.group_size, self.bits = map(int, v)

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self._idx, n)
        self._idx -= n
        self.offset = self.offset - n
        return n

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        assert self.values is not None  # set together with keys
        return sum(x.nbytes for x in (*self.keys, *self.values))
