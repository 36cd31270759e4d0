"""MLX caches to and from the NumPy arrays the SSD format stores, and the layout of the
caches a model makes (what every stored entry is checked against).

Attention KV (plain or quantized), sliding windows and recurrent states travel, one tensor
set per layer as kinds.py names them; bfloat16 travels as its uint16 bits. Zero-copy both
ways where the memory allows: a write sees NumPy views of the evaluated caches (to_numpy;
on CUDA views of device-made copies, device_copies); a restore reads each
tensor into an MLX array of its own (mlx_buffers), which from_numpy then uses as it is. The
copy a restore made before (`mx.array` of every tensor) was 61% of a 1.4 GB gemma3-12b
restore on this project's 2-core CPU (4.5 of 7.4 s, `python -m bench.restore --layers 48`).
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import (
    ArraysCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
    make_prompt_cache,
)

from mlxd.worker.cache.format import Layout
from mlxd.worker.cache.kinds import ARRAYS, BF16_STORED, QUANT_PARTS, ROTATING, kind
from mlxd.worker.cache.quiet_log import QuietLog
from mlxd.worker.cache.safetensors_file import TensorSpec
from mlxd.worker.kv.quant import QuantizedRowCache
from mlxd.worker.model.device import on_cuda

log = logging.getLogger("mlxd.worker.cache")


def _known(c) -> bool:
    return type(c) in (KVCache, RotatingKVCache, ArraysCache) or isinstance(c, QuantizedKVCache)


def storable(layers: list) -> bool:
    """Whether the SSD tier can hold these layers: attention KV (plain or quantized, not
    both), sliding windows and recurrent states."""
    quant = [isinstance(c, QuantizedKVCache) for c in layers if type(c) is not ArraysCache]
    return bool(layers) and all(_known(c) for c in layers) and (all(quant) or not any(quant))


def _bits_view(a: mx.array) -> mx.array:
    return a.view(mx.uint16) if a.dtype == mx.bfloat16 else a


def _parts(i: int, c: Any) -> dict[str, mx.array]:
    """Layer `i`'s tensors (MLX, before evaluation) by name."""
    if type(c) is RotatingKVCache:
        keys, values, *window = c.state  # offset, keep, window, write index: all public here
        rot = mx.array(window, dtype=mx.int64)
        return {f"{i}.k": keys, f"{i}.v": values, f"{i}.rot": rot}
    if type(c) is ArraysCache:
        return {f"{i}.a{j}": x for j, x in enumerate(c.state[0])}
    if isinstance(c, QuantizedKVCache):
        keys, values, offset, *_ = c.state
        return {
            f"{i}.{side}{suffix}": x[..., :offset, :]
            for side, triple in (("k", keys), ("v", values))
            for suffix, x in zip(QUANT_PARTS, triple)
        }
    return {f"{i}.k": c.keys[..., : c.offset, :], f"{i}.v": c.values[..., : c.offset, :]}


# Whether CPU-side reads and writes of cache entries go through copies the device makes. On
# CUDA, MLX keeps what the GPU computes in device memory, and the first CPU read of an array
# (the buffer protocol, as to_numpy's views) moves its buffer into managed memory for good:
# the SSD writer's read then pulls the pages to the host, and the entry's next use on the
# device (the session's next turn, which extends it) faults them back. `bench extend --ssd` on
# an H100 (2026-12-07): a lone row extending a 6k history written behind got its first token
# in 0.275 s, against 0.048 s with no SSD tier. So the writer reads a copy, and the other way
# round the read-ahead has the device copy what the CPU read into managed memory (from_numpy).
# None: on CUDA only (Apple silicon's memory is one, and the CPU backend reads its own memory).
DEVICE_COPIES: bool | None = None


def device_copies() -> bool:
    return on_cuda() if DEVICE_COPIES is None else DEVICE_COPIES


def copy_on_device(x: mx.array) -> mx.array:
    """A copy of `x` in a buffer of its own, made on the default stream (the device). A
    product by one, exact for every dtype these arrays have (bfloat16 travels as its bits);
    mlx 0.32 has no copying op (`mx.contiguous` shares a contiguous buffer)."""
    return mx.multiply(x, mx.array(1, dtype=x.dtype))


def to_numpy(
    layers: list, copy: bool = False
) -> tuple[dict[str, np.ndarray], dict[str, str], list]:
    """NumPy views of cache layers, as the SSD format names and stores them, and the evaluated
    MLX arrays behind them (they must outlive the views): views of the caches' own buffers,
    or with `copy` of copies the device makes (the write policy asks for them where
    device_copies says so)."""
    named = {n: _bits_view(a) for i, c in enumerate(layers) for n, a in _parts(i, c).items()}
    take = copy_on_device if copy else mx.contiguous
    keep: list = [take(a) for a in named.values()]
    mx.eval(keep)
    arrays = {n: np.asarray(memoryview(a)) for n, a in zip(named, keep)}
    return arrays, {"layers": str(len(layers))}, keep


_MX_DTYPES = {
    np.dtype(n): getattr(mx, n)
    for n in ("uint8", "uint16", "uint32", "int32", "int64", "float16", "float32", "bool_")
}


FILL_STREAMS = 8  # CPU streams that fill a restore's buffers at once (mlx_buffers)
# MLX streams belong to the thread that made them, and reads run on any thread of the event
# loop's executor: one long-lived thread makes the fill streams and every restore's arrays.
_filler: ThreadPoolExecutor | None = None
_filler_lock = threading.Lock()
_streams: list = []  # the filler thread's own
_quiet = QuietLog(log)


def mlx_buffers(specs: list[TensorSpec]) -> list[np.ndarray]:
    """One writable NumPy view of a fresh MLX array per tensor of an SSD entry
    (restore_read.read_tensors reads into them), so that each tensor becomes an MLX array
    without a copy (`_mx`). MLX fills a new array before it can be read into, one CPU
    stream's thread per array: the arrays go round several CPU streams, filled at once.
    Any thread. NumPy's memory where MLX cannot give it (then the restore copies)."""
    global _filler
    with _filler_lock:
        if _filler is None:
            _filler = ThreadPoolExecutor(1, thread_name_prefix="mlxd-cache-fill")
    try:
        return _filler.submit(_fill, specs).result()
    except Exception as exc:  # never fail a read over where its bytes live
        _quiet.warn("SSD restore into MLX memory (NumPy's instead, then copied)", exc)
        return [np.empty(t.shape, t.dtype) for t in specs]


def _fill(specs: list[TensorSpec]) -> list[np.ndarray]:
    """mlx_buffers' work, on the filler thread."""
    if not _streams:
        n = max(1, min(FILL_STREAMS, os.cpu_count() or 1))
        _streams.extend(mx.new_stream(mx.cpu) for _ in range(n))
    owners: list[mx.array | None] = []
    for i, t in enumerate(specs):
        dtype = _MX_DTYPES.get(t.dtype)
        ok = dtype is not None and t.stop > t.start
        s = _streams[i % len(_streams)]
        owners.append(mx.zeros(t.shape, dtype=dtype, stream=s) if ok else None)
    mx.eval([o for o in owners if o is not None])
    return [
        np.empty(t.shape, t.dtype) if o is None else np.asarray(memoryview(o))  # type: ignore[arg-type]
        for t, o in zip(specs, owners)
    ]


def _mlx_view(a: np.ndarray) -> mx.array | None:
    """An MLX array on the memory of the MLX array `a` is the whole of (`mlx_buffers` made
    it), found through NumPy's base chain; None for any other array."""
    base: object = a
    while isinstance(base, np.ndarray):
        base = base.base
    owner = base.obj if isinstance(base, memoryview) else None
    if not isinstance(owner, mx.array) or _MX_DTYPES.get(a.dtype) != owner.dtype:
        return None
    if tuple(owner.shape) != a.shape or not a.flags.c_contiguous:
        return None
    if np.frombuffer(base, np.uint8).ctypes.data != a.ctypes.data:
        return None
    # Another array on the same memory, never the owner itself: a sliding window rotates in
    # place (`keys[..., i, :] = ...`), and MLX would then write into the owner's buffer,
    # the read every request restoring this entry shares (keys.read_once).
    return owner.reshape(a.shape)


def _mx(a: np.ndarray, dtype: str, copy: bool = False) -> mx.array:
    x = _mlx_view(a)
    if x is None:
        x = mx.array(a)  # NumPy's memory: one copy
    elif copy:
        x = copy_on_device(x)
    return x.view(mx.bfloat16) if dtype == BF16_STORED else x


def from_numpy(arrays: dict[str, np.ndarray], layout: Layout, device_copy: bool = False) -> list:
    """Cache layers holding an SSD entry's arrays (checked against `layout`), evaluated.

    `device_copy` (the read-ahead, on CUDA): each tensor read into MLX memory is copied by the
    device first. The read filled managed memory from the CPU, so the first step on the entry
    would fault its pages over (gemma3-12b's 1.4 GB entry on an H100: that step 195 ms against
    140 ms on KV that never left the device, 2026-12-07); the read-ahead pays that while the
    worker is idle instead of a request paying it."""
    layers = [_layer(i, layer, arrays, device_copy) for i, layer in enumerate(layout)]
    mx.eval([c.state for c in layers])
    return layers


def _layer(i: int, layer: tuple, arrays: dict[str, np.ndarray], copy: bool = False) -> Any:
    """Layer `i` of an entry. Through mlx-lm's `state` setters: they assign what the
    attributes hold (mlx-lm's __init__ sets them to None, so they read as None-typed)."""
    k = kind(layer)
    if k == ARRAYS:
        a = ArraysCache(size=len(layer) - 1)
        slots = [_mx(arrays[f"{i}.a{j}"], d, copy) for j, (_, d) in enumerate(layer[1:])]
        a.state = (slots, None, None)  # its states, no batch padding nor lengths
        return a
    if k == "quant":
        dtype, bits, group = layer[4], layer[5], layer[6]
        q = QuantizedRowCache(group_size=group, bits=bits)
        qk, qv = (
            tuple(_mx(arrays[f"{i}.{side}{s}"], dtype if s else "", copy) for s in QUANT_PARTS)
            for side in "kv"
        )
        q.state = (qk, qv, qk[0].shape[2], group, bits)
        return q
    dtype = layer[5] if k == ROTATING else layer[4]
    keys, values = _mx(arrays[f"{i}.k"], dtype, copy), _mx(arrays[f"{i}.v"], dtype, copy)
    if k == ROTATING:
        window, keep = layer[6], layer[7]
        r = RotatingKVCache(max_size=window, keep=keep)
        offset, _, _, at = (int(x) for x in arrays[f"{i}.rot"])
        r.state = (keys, values, offset, keep, window, at)
        return r
    c = KVCache()
    c.state = (keys, values, keys.shape[2])
    return c


def _layer_layout(c: Any) -> tuple:
    if type(c) is ArraysCache:
        return (ARRAYS, *((tuple(x.shape[1:]), _stored(x.dtype)) for x in c.state[0]))
    if isinstance(c, QuantizedKVCache):
        (k, ks, _), (v, _, _), *_ = c.state  # (keys, values, offset, group size, bits)
        per = 32 // c.bits  # packed uint32 values hold 32 / bits elements each
        return (k.shape[1], k.shape[3] * per, v.shape[1], v.shape[3] * per, _stored(ks.dtype),
                c.bits, c.group_size)  # fmt: skip
    k, v = c.keys, c.values
    shape = (k.shape[1], k.shape[3], v.shape[1], v.shape[3], _stored(k.dtype))
    return (ROTATING, *shape, c.max_size, c.keep) if type(c) is RotatingKVCache else shape


def _stored(dtype) -> str:
    """The dtype a file holds for `dtype` (bfloat16's bits as uint16)."""
    return BF16_STORED if dtype == mx.bfloat16 else str(dtype).rsplit(".", 1)[-1]


def kv_layout(model) -> Layout | None:
    """Per-layer layout (kinds.py) of the caches this model makes, from one token through a
    fresh set; None when one of them is of a kind the SSD tier cannot hold."""
    caches = make_prompt_cache(model)
    if not storable(caches):
        return None
    model(mx.array([[0]]), cache=caches)
    mx.eval([c.state for c in caches])
    if any(type(c) is ArraysCache and any(x is None for x in c.state[0]) for c in caches):
        return None  # a state slot one token leaves empty: nothing to check entries against
    return tuple(_layer_layout(c) for c in caches)
