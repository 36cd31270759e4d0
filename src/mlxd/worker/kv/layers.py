"""What a model's cache layers are made of, as the engine plans by it."""

from __future__ import annotations

from mlx_lm.models.cache import KVCache, QuantizedKVCache


def attention_only(caches: list) -> bool:
    """Whether every layer is attention KV (mlx-lm's KVCache, plain or quantized).

    Those trim to any shorter prefix and mask a batch's padding. A sliding window
    (RotatingKVCache) trims only while it has not wrapped, so the engine treats it as it
    treats recurrent states: snapshots at exact prompt lengths."""
    return all(type(c) is KVCache or isinstance(c, QuantizedKVCache) for c in caches)


def plain_only(caches: list) -> bool:
    """Whether every layer is mlx-lm's float KVCache (not quantized, not a window, not a
    recurrent state): its arrays and an offset, nothing else."""
    return all(type(c) is KVCache for c in caches)
