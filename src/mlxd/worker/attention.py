"""Prefill attention on CUDA without a cuDNN graph build per prompt.

MLX's CUDA attention hands every masked multi-token call to cuDNN, which builds (and caches,
256 at most) a graph per combination of rows, query and key lengths, KV buffer capacity and
mask shape. A server meets a new combination at nearly every prefill: prompt lengths vary,
and a batch's prompt rows (mlx-lm's BatchKVCache) always carry an array mask, even alone.
On the lent H200 such a build took 80 ms (8B shape) to 1.5 s (0.6B shape) where the prefill
itself took 25-140 ms; every row in the batch waited for it (docs/benchmarks.md, 2026-12-02
afternoon). Turning cuDNN off for the whole process (MLX_CUDA_USE_CUDNN_SDPA=0) removes the
builds but made an 8B 16k-token prefill 2.5x slower.

So attention is routed per call: a multi-token call whose score matrix is small (at most
SMALL_SCORES_BYTES) is computed as the plain product (scores, softmax, values: what MLX
itself does where no fused kernel applies), which costs a few ms at that size and needs no
build; larger ones (long prompts' 4096-token chunks, whose shapes recur from prompt to
prompt) and every decode call keep MLX's fused kernels. Only on CUDA: Metal's fused kernels
take any shape without a build, and the CPU has no fused prefill kernel to avoid.

mlx-lm's models call `mx.fast.scaled_dot_product_attention` by attribute at every forward,
so replacing that attribute in the worker process routes them all (route_on_cuda).
"""

from __future__ import annotations

import logging
import sys

import mlx.core as mx

log = logging.getLogger("mlxd.worker")

# The largest score matrix (rows x heads x queries x keys, float32) computed unfused: a
# transient of at most this many bytes per layer; 8 rows of 512-token prompts on a 32-head
# model take 268 MB, one 2k-token prompt 537 MB.
SMALL_SCORES_BYTES = 1 << 30

_fused = mx.fast.scaled_dot_product_attention


def unfused(
    q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array | str | None
) -> mx.array:
    """Attention as three plain ops: q (B, H, L, D), k and v (B, Hkv, S, D), grouped heads
    (H a multiple of Hkv); `mask` as mx.fast takes it (None, "causal", boolean or additive)."""
    b, h, n, _ = q.shape
    hkv, s = k.shape[1], k.shape[2]
    rep = h // hkv
    q = q * mx.array(scale, q.dtype)
    if rep > 1:  # (B, Hkv, rep, L, D) against (B, Hkv, 1, S, D): no copy of the keys
        q = q.reshape(b, hkv, rep, n, -1)
        k, v = mx.expand_dims(k, 2), mx.expand_dims(v, 2)
    scores = q @ k.swapaxes(-1, -2)
    if isinstance(mask, str):  # "causal", aligned to the end of the keys
        mask = mx.arange(s - n, s)[:, None] >= mx.arange(s)[None]
    if mask is not None:
        if rep > 1 and mask.ndim == 4:
            mask = mx.expand_dims(mask, 2)
        if mask.dtype == mx.bool_:
            scores = mx.where(mask, scores, mx.array(mx.finfo(scores.dtype).min, scores.dtype))
        else:
            scores = scores + mask
    out = mx.softmax(scores, axis=-1, precise=True) @ v
    return out.reshape(b, h, n, -1) if rep > 1 else out


def is_small(q: mx.array, k: mx.array) -> bool:
    """Whether a call's score matrix stays within SMALL_SCORES_BYTES."""
    b, h, n, _ = q.shape
    return n > 1 and b * h * n * k.shape[2] * 4 <= SMALL_SCORES_BYTES


def routed(q, k, v, *, scale, mask=None, sinks=None, **kw):
    """mx.fast.scaled_dot_product_attention, with small multi-token calls unfused."""
    if sinks is None and not kw and is_small(q, k) and k.shape[1] and q.shape[1] % k.shape[1] == 0:
        return unfused(q, k, v, scale, mask)
    if sinks is not None:
        kw["sinks"] = sinks
    return _fused(q, k, v, scale=scale, mask=mask, **kw)


def route_on_cuda(force: bool = False) -> bool:
    """Route this process's attention calls (routed) when its GPU is an NVIDIA one (or
    `force`, for tests); True when routed. Idempotent."""
    if mx.fast.scaled_dot_product_attention is routed:
        return True
    cuda = sys.platform.startswith("linux") and mx.default_device() == mx.gpu
    if not (cuda or force):
        return False
    mx.fast.scaled_dot_product_attention = routed
    log.info(
        "attention: calls of up to %d MiB of scores unfused (no cuDNN graph builds)",
        SMALL_SCORES_BYTES >> 20,
    )
    return True
