"""The decode forward, compiled (`mx.compile`) once per shape instead of rebuilt every step.

A decode step calls the model on one token per row. Built in Python each step, that graph
costs milliseconds of host time (docs/benchmarks.md: "where a decode step goes"), more than a
small model's device time. Compiled, the model's Python runs once per shape, and MLX fuses
the step's elementwise kernels.

A compiled function sees only arrays, with shapes fixed per trace; mlx-lm's caches grow by
Python ints. So the step runs over the caches' whole allocated buffers (a multiple of STEP
positions), through views whose write position and RoPE offsets are arrays and whose mask
hides the unwritten tail (and a batch row's left padding). The shapes then change only when a
buffer grows (every STEP tokens) or the rows change; each (rows, capacity) pair is traced
once and kept, up to MAX_SHAPES per model (each holds the traced graph: ~3.5 MB of host
memory for a 36-layer model); past that the traces are dropped and the shapes in use are
traced again, so a long-lived worker's batches and contexts cannot grow them without bound.

Only mlx-lm's float caches are compiled: a lone row's `KVCache`, a batch's `BatchKVCache`.
Quantized, rotating or recurrent caches take the plain forward. A model whose Python reads
the cache in a way that cannot be traced (a Python int from `offset`, ...) fails its first
trace; it then takes the plain forward for the life of the process. The first compiled
step of each cache kind is also checked against the plain forward on the same input, and a
model whose logits disagree is never compiled again (`CompiledStep.off` says why).
"""

from __future__ import annotations

import logging
from typing import cast

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

from mlxd.worker.model import mlx_lm_seam as seam

log = logging.getLogger("mlxd.worker.engine.loop")

STEP = 256  # capacity granularity (KVCache and BatchKVCache grow by the same step)
MAX_SHAPES = 32  # traced (rows, capacity) shapes kept per model before they are all dropped
AGREE = 0.05  # largest |compiled - plain| logit difference, relative to the largest logit


class _View:
    """One layer's cache as the traced model sees it: whole buffers, array positions."""

    def __init__(self, keys, values, idx, offset, mask):
        self.keys, self.values = keys, values
        self._idx, self.offset, self._mask = idx, offset, mask

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        self.keys = mx.slice_update(self.keys, keys, self._idx, axes=(2,))
        self.values = mx.slice_update(self.values, values, self._idx, axes=(2,))
        return self.keys, self.values

    def make_mask(self, n: int, **_kw) -> mx.array:
        return self._mask


class CompiledStep:
    """A model's compiled decode forward; one per model (`for_model`)."""

    def __init__(self, model):
        self.model = model
        self.off: str | None = None  # why compiling is off for this model, when it is
        self.checked: set[type] = set()  # cache kinds whose compiled step agreed with plain
        self.shapes: set[tuple] = set()  # (cache kind, rows, capacity) traced by `_fn`
        self._fn = mx.compile(self._forward)

    def _forward(self, tokens, idx, offset, left, *kv):
        n = len(kv) // 2
        cap = kv[0].shape[2]
        pos = mx.arange(cap)
        seen = pos <= idx  # written positions, this step's included
        if left.ndim:  # a batch: each row's own left padding is masked too
            seen = (seen[None] & (pos[None] >= left[:, None]))[:, None, None, :]
        views = [_View(kv[i], kv[n + i], idx, offset, seen) for i in range(n)]
        logits = self.model(tokens[:, None], cache=views)[:, -1, :]
        return (logits, offset + 1, *(v.keys for v in views), *(v.values for v in views))

    def usable(self, caches: list) -> bool:
        """Whether this batch's forward can be compiled."""
        if self.off is not None or not caches:
            return False
        kind = type(caches[0])
        if kind not in (KVCache, BatchKVCache) or caches[0].keys is None:
            return False  # recurrent, rotating, quantized or list caches, or nothing written
        if kind is KVCache and mx.default_device() != mx.cpu:
            # A lone row's plain attention has no mask: one fused kernel on a GPU, which the
            # compiled step's masked attention is not (H200, 0.6B: 254 plain vs 180 tok/s).
            return False
        return all(type(c) is kind for c in caches)

    def __call__(self, tokens: mx.array, caches: list) -> mx.array | None:
        """The (rows, vocab) logits of one decode step, the caches advanced as the plain
        forward would; None when this model cannot be compiled (the caller runs the plain
        forward; the caches are untouched)."""
        kind = type(caches[0])
        batch = kind is BatchKVCache
        first = caches[0]
        idx_int = seam.write_index(first) if batch else first.offset
        _fit(caches, idx_int)
        idx = mx.array(idx_int, dtype=mx.int32)
        offset = first.offset if batch else idx
        left = first.left_padding if batch else mx.array(0)
        kv = [c.keys for c in caches] + [c.values for c in caches]
        shape = (kind, kv[0].shape[0], kv[0].shape[2])
        if shape not in self.shapes:
            if len(self.shapes) >= MAX_SHAPES:  # drop every trace (MLX frees them with _fn)
                self._fn, self.shapes = mx.compile(self._forward), set()
            self.shapes.add(shape)
        try:
            out = self._fn(tokens, idx, offset, left, *kv)
        except Exception as e:  # noqa: BLE001 - any trace failure: this model stays plain
            self._disable(f"its forward cannot be traced ({type(e).__name__}: {e})")
            return None
        del kv
        logits, nxt, n = out[0], out[1], len(caches)
        if kind not in self.checked and not self._agrees(logits, tokens, caches):
            return None
        for i, c in enumerate(caches):
            c.keys, c.values = out[2 + i], out[2 + n + i]
            if batch:  # one offsets array for every layer (mlx-lm never changes it in place)
                seam.advance_write_index(c)
                c.offset = nxt
            else:
                c.offset += 1
        return logits

    def _agrees(self, logits: mx.array, tokens: mx.array, caches: list) -> bool:
        """The first compiled step of a cache kind against the plain forward (on the caches
        as they are: the plain forward's writes land past the current position, where the
        compiled step writes the same values next)."""
        kind = type(caches[0])
        saved = [_state(c) for c in caches]
        plain = self.model(tokens[:, None], cache=caches)[:, -1, :]
        for c, s in zip(caches, saved, strict=True):
            _restore(c, s)
        scale = mx.maximum(mx.abs(plain).max(), 1e-6)
        diff = mx.abs(logits.astype(mx.float32) - plain.astype(mx.float32)).max() / scale
        worst = cast(float, diff.item())  # mlx's stub: item() is any scalar; a float32 here
        if worst > AGREE:
            self._disable(f"its compiled logits differ from the plain forward's ({worst:.3f})")
            return False
        self.checked.add(kind)
        return True

    def _disable(self, why: str) -> None:
        self.off = why
        log.warning("decode step not compiled for this model: %s", why)


def _fit(caches: list, idx: int) -> None:
    """Give every layer's buffers room for position `idx`, in whole STEPs (a batch's filter
    can leave any length: round it so the traced shapes stay few)."""
    cap = caches[0].keys.shape[2]
    if idx < cap and cap % STEP == 0:
        return
    want = (idx // STEP + 1) * STEP
    for c in caches:
        c.keys, c.values = _resize(c.keys, want, idx), _resize(c.values, want, idx)


def _resize(x: mx.array, cap: int, used: int) -> mx.array:
    keep = x[..., : min(used, x.shape[2]), :]
    pad = mx.zeros((*x.shape[:2], cap - keep.shape[2], x.shape[3]), dtype=x.dtype)
    return mx.concatenate([keep, pad], axis=2)


def _state(c) -> tuple:
    """Everything a forward moves in `c` (a KVCache's own `state` is cut to its offset)."""
    return c.state if type(c) is BatchKVCache else (c.keys, c.values, c.offset)


def _restore(c, s: tuple) -> None:
    if type(c) is BatchKVCache:
        c.state = s
    else:
        c.keys, c.values, c.offset = s


ATTR = "_mlxd_compiled_step"


def for_model(model) -> CompiledStep:
    """The model's compiled step, kept on the model (its traces live and die with it)."""
    step = getattr(model, ATTR, None)
    if step is None:
        step = CompiledStep(model)
        setattr(model, ATTR, step)  # a plain attribute: mlx's Module keeps it out of its tree
    return step
