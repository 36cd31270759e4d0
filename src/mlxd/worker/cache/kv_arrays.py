"""MLX KV caches to and from the NumPy arrays the SSD format stores (zero-copy one way)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache

from mlxd.worker.cache.format import pack_kv, unpack_kv


def to_numpy(layers: list) -> tuple[dict[str, np.ndarray], dict[str, str], list]:
    """Zero-copy NumPy views of KVCache layers, as the SSD format names and stores them, and
    the evaluated MLX arrays behind them (they must outlive the views)."""
    keep = []
    for c in layers:
        for a in (c.keys, c.values):
            a = a[..., : c.offset, :]
            if a.dtype == mx.bfloat16:
                a = a.view(mx.uint16)
            keep.append(a)
    mx.eval(keep)
    views = [np.asarray(memoryview(a)) for a in keep]
    arrays, meta = pack_kv(list(zip(views[::2], views[1::2])), str(layers[0].keys.dtype))
    return arrays, meta, keep


def from_numpy(arrays: dict[str, np.ndarray]) -> list:
    """KVCache layers holding an SSD entry's arrays, evaluated."""
    layers = []
    pairs, bf16 = unpack_kv(arrays)
    for k, v in pairs:
        c = KVCache()
        k, v = mx.array(k), mx.array(v)
        if bf16:
            k, v = k.view(mx.bfloat16), v.view(mx.bfloat16)
        c.keys, c.values, c.offset = k, v, k.shape[2]
        layers.append(c)
    mx.eval([c.state[:2] for c in layers])
    return layers
