"""What a row's KV costs, measured from the model's own caches at load.

One token goes through `make_prompt_cache(model)` (quantized when kv_bits is set: the model's
`make_cache` hook, quant.py), and each layer's cache says what it holds (shared/kv_math.py's
KvCost): a KVCache or QuantizedKVCache adds its arrays' bytes per position (their shapes and
dtypes over the positions axis, not the nbytes of a 256-step buffer), a RotatingKVCache the
same up to its `max_size`, an ArraysCache (Mamba, gated delta) its states' bytes once per row,
a CacheList the sum of its parts. The forward is never evaluated: shapes and dtypes are known
without running it (and a sharded model's collectives never run on one rank alone).
A cache kind this does not know raises UnknownCache; `row_cost` then falls back to the
config's arithmetic (shared/kv_config.py), and logs why.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, CacheList, RotatingKVCache, make_prompt_cache

from mlxd.shared.kv_config import kv_cost_of_config
from mlxd.shared.kv_math import KvCost

log = logging.getLogger("mlxd.worker.kv.cost")

POSITIONS_AXIS = 2  # K and V arrays are (batch, heads, positions, dim)


class UnknownCache(ValueError):
    """A layer cache whose holdings this module cannot read."""


def row_cost(
    model, config: dict, dtype_bytes: int, kv_bits: int | None, group_size: int
) -> KvCost | None:
    """What a row of `model` holds: measured, or from its `config` where a cache kind is new
    to this module or the one-token forward fails (None: neither says)."""
    try:
        return measure_kv_cost(model)
    except Exception as exc:  # a load never fails for want of a measurement
        log.warning("KV cost from config.json: cannot measure the caches (%s)", exc)
        return kv_cost_of_config(config, dtype_bytes, kv_bits, group_size)


def measure_kv_cost(model) -> KvCost:
    """What one row of `model` holds per token, per window and per row (a fresh cache, one
    token)."""
    caches = make_prompt_cache(model)
    model(mx.array([[0]]), cache=caches)
    total = KvCost(0)
    for c in caches:
        total = total + layer_cost(c)
    return total


def layer_cost(c) -> KvCost:
    """One layer's cache after a token: what it holds per position, window and row."""
    if isinstance(c, CacheList):
        total = KvCost(0)
        for part in c.caches:
            total = total + layer_cost(part)
        return total
    if isinstance(c, ArraysCache):
        states: list[mx.array | None] = list(c.cache)  # mlx-lm fills its None slots
        return KvCost(0, per_row=sum(a.nbytes for a in states if a is not None))
    keys, values = getattr(c, "keys", None), getattr(c, "values", None)
    if keys is None or values is None:
        raise UnknownCache(f"cannot read the KV of a {type(c).__name__}")
    per = per_position(keys) + per_position(values)
    if isinstance(c, RotatingKVCache):
        return KvCost(0, per, int(c.max_size))
    return KvCost(per)


def per_position(side) -> int:
    """Bytes one position takes in a K or V side: an array, or a quantized cache's (packed,
    scales, biases)."""
    arrays: Iterable[mx.array] = side if isinstance(side, (tuple, list)) else (side,)
    total = 0
    for a in arrays:
        if a.ndim != 4 or a.shape[0] != 1:
            raise UnknownCache(f"a KV array of shape {a.shape}")
        total += a.nbytes // a.shape[POSITIONS_AXIS]
    return total
