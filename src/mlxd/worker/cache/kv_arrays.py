"""MLX KV caches to and from the NumPy arrays the SSD format stores (zero-copy one way), and
the layout of the KV a model makes (what every stored entry is checked against).

Plain KVCache layers and quantized ones (kvquant.py: packed values, scales, biases) travel;
bfloat16 travels as its uint16 bits (NumPy has no bfloat16).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

from mlxd.worker.cache.format import BF16_STORED, Layout, pack_kv, unpack_kv
from mlxd.worker.kv.quant import QuantizedRowCache


def storable(layers: list) -> bool:
    """Whether the SSD tier can hold these layers (plain or quantized KV, all one kind)."""
    return bool(layers) and (
        all(type(c) is KVCache for c in layers)
        or all(isinstance(c, QuantizedKVCache) for c in layers)
    )


def _bits_view(a: mx.array) -> mx.array:
    return a.view(mx.uint16) if a.dtype == mx.bfloat16 else a


def to_numpy(layers: list) -> tuple[dict[str, np.ndarray], dict[str, str], list]:
    """Zero-copy NumPy views of KV layers, as the SSD format names and stores them, and the
    evaluated MLX arrays behind them (they must outlive the views)."""
    keep: list = []
    quant = isinstance(layers[0], QuantizedKVCache)
    for c in layers:
        for a in (c.keys, c.values):
            if quant:
                keep.extend(_bits_view(x[..., : c.offset, :]) for x in a)
            else:
                keep.append(_bits_view(a[..., : c.offset, :]))
    mx.eval(keep)
    views = [np.asarray(memoryview(a)) for a in keep]
    sides: list[tuple[np.ndarray, ...]] | list[np.ndarray]
    if quant:
        sides = [tuple(views[i : i + 3]) for i in range(0, len(views), 3)]
        dtype = str(layers[0].keys[1].dtype)
    else:
        sides, dtype = views, str(layers[0].keys.dtype)
    arrays, meta = pack_kv(list(zip(sides[::2], sides[1::2])), dtype)
    return arrays, meta, keep


def _mx(a: np.ndarray, bf16: bool) -> mx.array:
    x = mx.array(a)
    return x.view(mx.bfloat16) if bf16 and x.dtype == mx.uint16 else x


def from_numpy(arrays: dict[str, np.ndarray], quant: tuple[int, int] | None = None) -> list:
    """KV cache layers holding an SSD entry's arrays, evaluated; `quant` (bits, group size)
    for a quantized entry."""
    layers: list = []
    pairs, bf16 = unpack_kv(arrays)
    for k, v in pairs:
        # Through mlx-lm's `state` setters: they assign what the attributes hold (mlx-lm's
        # __init__ sets them to None, so they read as None-typed).
        if quant is not None and isinstance(k, tuple):
            bits, group = quant
            qc = QuantizedRowCache(group_size=group, bits=bits)
            qkeys = tuple(_mx(x, bf16) for x in k)
            qc.state = (qkeys, tuple(_mx(x, bf16) for x in v), qkeys[0].shape[2], group, bits)
            layers.append(qc)
        else:
            c = KVCache()
            keys = _mx(k, bf16)
            c.state = (keys, _mx(v, bf16), keys.shape[2])
            layers.append(c)
    mx.eval([(c.keys, c.values) for c in layers])
    return layers


def kv_layout(model) -> Layout | None:
    """Per-layer (key heads, key dim, value heads, value dim, stored dtype) of the KV this
    model makes, from one token through a fresh cache, plus (bits, group size) when it is
    quantized; None when its caches are neither all plain KVCache nor all quantized (the
    kinds the SSD tier holds)."""
    caches = make_prompt_cache(model)
    if not storable(caches):
        return None
    model(mx.array([[0]]), cache=caches)
    mx.eval([(c.keys, c.values) for c in caches])
    out: list[tuple] = []
    for c in caches:
        if isinstance(c, QuantizedKVCache):
            (k, ks, _), (v, _, _), *_ = c.state  # (keys, values, offset, group size, bits)
            # Packed values are uint32 holding 32 / bits elements each: the dims they stand for.
            per = 32 // c.bits
            kd, vd, dtype = k.shape[3] * per, v.shape[3] * per, ks.dtype
            quant: tuple = (c.bits, c.group_size)
        else:
            k, v = c.keys, c.values
            kd, vd, dtype, quant = k.shape[3], v.shape[3], k.dtype, ()
        # bfloat16 travels as uint16 (NumPy has no bfloat16): what the file holds is checked.
        stored = BF16_STORED if dtype == mx.bfloat16 else str(dtype).rsplit(".", 1)[-1]
        out.append((k.shape[1], kd, v.shape[1], vd, stored, *quant))
    return tuple(out)


def layout_quant(layout: Layout | None) -> tuple[int, int] | None:
    """(bits, group size) of a quantized layout, else None."""
    if not layout or len(layout[0]) != 7:
        return None
    return int(layout[0][5]), int(layout[0][6])
