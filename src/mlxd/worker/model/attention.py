"""Prefill attention: the fused causal kernel where the mask allows, and on CUDA no cuDNN
graph build per prompt and no cuDNN biased kernel.

The mask first. mlx-lm's float BatchKVCache hands the model an array mask at every multi-token
call, though for rows without left padding (fresh prompts admitted together, a lone row: nearly
every long prefill) it is exactly the causal one. `causal_when_unpadded` (every backend) makes
such a cache say "causal", so MLX's fused causal kernels run (cuDNN's flash attention on CUDA);
quantized-KV and sliding-window caches keep their arrays. On the lent H200 a lone 16k-token
prompt of the 8B shape, in 4,096-token chunks, took 2.8 s and 68 GiB of peak memory with the
array mask (cuDNN with a bias) and 0.57 s and 26 GiB as "causal" (docs/benchmarks.md,
2026-12-02 evening).

Then, on CUDA, each multi-token call is routed:
- small (scores under `small_scores_bytes`), causal or with an array mask: the plain product
  (scores, softmax, values: what MLX does where no fused kernel applies). MLX would hand it to
  cuDNN, which builds (and caches, 256 at most) a graph per combination of rows, query and key
  lengths, KV capacity and mask shape: 80 ms (8B shape) to 1.5 s (0.6B shape) where the call
  itself takes a few ms, at nearly every prefill since prompt lengths vary (2026-12-02
  afternoon). Turning cuDNN off for the process instead made an 8B 16k prefill 2.5x slower.
- large, with the mask a left-padded BatchKVCache made (rows of different histories: a
  newcomer joining a running prefill, prompt-cache hits of unequal lengths): row by row
  through the fused causal kernel, each on its own keys from its padding on, which is what
  that mask says.
- large, with another array mask: the plain product in blocks of queries, each block's scores
  under the bound (2.0 s and 31 GiB for the 16k prompt above, against cuDNN's 2.8 s and 68 GiB).
- everything else (large causal calls, unmasked ones, decode, attention sinks, per-head masks)
  keeps MLX's fused kernels.
With shape buckets on (shape_buckets.py, the default), rows extending cached prefixes go to the
fused causal kernel at any size, padded to bucketed shapes: a left-padded batch row by row,
an unpadded one whole.
Only on CUDA: Metal's fused kernels take any shape without a build, and the CPU has no fused
prefill kernel to avoid.

mlx-lm's models call `mx.fast.scaled_dot_product_attention` by attribute at every forward,
so replacing that attribute in the worker process routes them all (route_on_cuda); they ask
their cache for the mask at every forward too (`make_mask`).
"""

from __future__ import annotations

import logging
import sys
import weakref

import mlx.core as mx

from mlxd.worker.model import blocks, shape_buckets
from mlxd.worker.model import mlx_lm_seam as seam

log = logging.getLogger("mlxd.worker")

# The largest score matrix (rows x heads x queries x keys, 4 bytes a score) computed unfused:
# a transient of less than this per layer. 8 rows of 512-token prompts on a 32-head model
# take 268 MB. At most 1/64 of the device's memory (1 GiB on an H200), so that a small GPU's
# plan headroom (shared/memory_plan.py) covers it.
SMALL_SCORES_CAP = 1 << 30
small_scores_bytes = SMALL_SCORES_CAP  # set by route_on_cuda from the device's memory

_fused = seam.ORIGINAL_SDPA


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
    """Whether a multi-token call's score matrix stays under `small_scores_bytes`."""
    b, h, n, _ = q.shape
    return n > 1 and b * h * n * k.shape[2] * 4 < small_scores_bytes


def _plain_mask(mask, q: mx.array) -> bool:
    """An array mask `unfused` reads as MLX does: boolean or of q's dtype, one for all heads."""
    if not isinstance(mask, mx.array):
        return False
    same_heads = mask.ndim < 3 or mask.shape[-3] == 1
    return same_heads and mask.dtype in (mx.bool_, q.dtype)


def blocked(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array) -> mx.array:
    """`unfused`, a block of queries at a time: each block's scores under `small_scores_bytes`
    (at least one query a block), so the transient is bounded whatever the call's size."""
    b, h, n, _ = q.shape
    step = max(1, small_scores_bytes // (b * h * k.shape[2] * 4))
    per_query = mask.ndim >= 2 and mask.shape[-2] == n  # else one row broadcast to all
    out = [
        unfused(
            q[:, :, i : i + step], k, v, scale, mask[..., i : i + step, :] if per_query else mask
        )
        for i in range(0, n, step)
    ]
    return mx.concatenate(out, axis=2)


def routed(q, k, v, *, scale, mask=None, sinks=None, **kw):
    """mx.fast.scaled_dot_product_attention, with masked multi-token calls unfused where MLX
    would build a cuDNN graph (small calls) or run cuDNN's slow biased kernel (array masks)."""
    grouped = k.shape[1] > 0 and q.shape[1] % k.shape[1] == 0
    if sinks is None and not kw and grouped and q.shape[2] > 1:
        if (pieces := _in_blocks(q, k, mask)) is not None:
            return in_pieces(q, k, v, scale, pieces)
        if shape_buckets.on and (bucketed := _bucketed(q, k, v, scale, mask)) is not None:
            return bucketed
        plain = _plain_mask(mask, q)
        if (plain or isinstance(mask, str) and mask == "causal") and is_small(q, k):
            return unfused(q, k, v, scale, mask)
        if (left := _left_padding_of(mask)) is not None:
            return row_by_row(q, k, v, scale, left)
        if plain:
            return blocked(q, k, v, scale, mask)
    if sinks is not None:
        kw["sinks"] = sinks
    return _fused(q, k, v, scale=scale, mask=mask, **kw)


def _bucketed(q, k, v, scale: float, mask) -> mx.array | None:
    """Rows extending cached prefixes (shape_buckets.py), whatever their size: a left-padded
    batch row by row, an unpadded one whole; None for anything else (fresh prompts)."""
    if (left := _left_padding_of(mask)) is not None:
        # Extensions only: a fresh prompt's left padding leaves queries that see no key.
        return row_by_row(q, k, v, scale, left) if q.shape[2] < k.shape[2] - max(left) else None
    if isinstance(mask, str) and mask == "causal" and q.shape[2] < k.shape[2]:
        return shape_buckets.causal(_fused, q, k, v, scale)
    return None


def row_by_row(q: mx.array, k: mx.array, v: mx.array, scale: float, left: list[int]) -> mx.array:
    """A left-padded batch's causal attention through the fused causal kernel, each run of
    neighbouring rows with the same padding in one call on their own keys (from the padding
    on): what the array mask says, without scores and without attending the padding. Rows of
    one padding (newcomers admitted together) share a call, so a cuDNN graph per padding."""
    return in_pieces(q, k, v, scale, list(_runs(left)), contiguous=False)


def _runs(left: list[int]):
    """(first row, end row, padding) of each run of neighbouring rows with equal padding."""
    start = 0
    for end in range(1, len(left) + 1):
        if end == len(left) or left[end] != left[start]:
            yield start, end, left[start]
            start = end


def _in_blocks(q: mx.array, k: mx.array, mask) -> list[tuple[int, int, int]] | None:
    """For a prefill call whose every row's queries and keys are whole blocks (blocks.py):
    the pieces (first row, end row, first key) to send to the fused causal kernel, rows of
    one padding in runs of 1, 2, 4, ... so the kernel meets few batch sizes. None otherwise."""
    n, s = q.shape[2], k.shape[2]
    if not blocks.is_whole(n):
        return None
    left: list[int] | None
    if isinstance(mask, str) and mask == "causal":
        left = [0] * q.shape[0]
    else:
        left = _left_padding_of(mask)
    if left is None or not all(blocks.is_whole(s - p) for p in left):
        return None
    pieces = []
    for start, end, p in _runs(left):
        while start < end:  # the largest power of two that fits
            size = 1 << ((end - start).bit_length() - 1)
            pieces.append((start, start + size, p))
            start += size
    return pieces


def in_pieces(
    q, k, v, scale: float, pieces: list[tuple[int, int, int]], contiguous: bool = True
) -> mx.array:
    """Causal attention through the fused kernel, piece by piece (first row, end row,
    padding), each on its own keys from its padding on; `contiguous`: those keys copied out
    of the batch's buffer, so the kernel's graph depends on the piece's shape only (whole
    blocks, `_in_blocks`)."""
    out = []
    for start, end, p in pieces:
        keys, values = k[start:end, :, p:], v[start:end, :, p:]
        if contiguous:
            keys, values = mx.contiguous(keys), mx.contiguous(values)
        if not contiguous and shape_buckets.on:
            out.append(shape_buckets.causal(_fused, q[start:end], keys, values, scale))
        else:
            out.append(_fused(q[start:end], keys, values, scale=scale, mask="causal"))
    return mx.concatenate(out, axis=0) if len(out) > 1 else out[0]


_array_mask = seam.ORIGINAL_MAKE_MASK
# The last causal mask a left-padded BatchKVCache made, and its rows' padding: `routed` knows
# that array by identity and attends row by row (a mask another op made or changed is not it).
_padded: tuple[weakref.ref, list[int]] | None = None


def _left_padding_of(mask) -> list[int] | None:
    if _padded is None or not isinstance(mask, mx.array) or _padded[0]() is not mask:
        return None
    return _padded[1]


def _unpadded_causal_mask(self, N: int, return_array: bool = False, **kw):
    """BatchKVCache.make_mask, but "causal" for a multi-token call when no row is left-padded
    (the array would be exactly the causal mask: mlx-lm's right padding is never attended)."""
    global _padded
    if N <= 1 or return_array or kw.get("window_size") is not None:
        return _array_mask(self, N, return_array=return_array, **kw)
    left = self.left_padding.tolist()
    if max(left, default=0) == 0:
        return "causal"
    mask = _array_mask(self, N, **kw)
    _padded = (weakref.ref(mask), left)
    return mask


def causal_when_unpadded() -> None:
    """Make mlx-lm's BatchKVCache give "causal" instead of an all-causal array mask (above).
    Idempotent; every backend."""
    seam.patch_make_mask(_unpadded_causal_mask)


def route_on_cuda(memory_bytes: int = 0, force: bool = False) -> bool:
    """Route this process's attention calls (routed) when its GPU is an NVIDIA one (or
    `force`, for tests); `memory_bytes`: the device's, which bounds what is routed. True when
    routed. Idempotent."""
    global small_scores_bytes
    if seam.sdpa() is routed:
        return True
    cuda = sys.platform.startswith("linux") and mx.default_device() == mx.gpu
    if not (cuda or force):
        return False
    cap = SMALL_SCORES_CAP
    small_scores_bytes = min(cap, memory_bytes // 64) if memory_bytes > 0 else cap
    seam.patch_sdpa(routed)
    log.info(
        "attention: masked prefills under %d MiB of scores unfused (no cuDNN graph builds)",
        small_scores_bytes >> 20,
    )
    return True
