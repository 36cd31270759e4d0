"""Plain KV caches of random values for the prompt cache's tests (real MLX arrays)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, RotatingKVCache

HEADS, DIM = 2, 4
LAYOUT = ((HEADS, DIM, HEADS, DIM, "float32"),) * 2  # what layers() makes: two layers


def layers(n: int, seed: int = 0) -> list:
    """A two-layer model's caches holding `n` tokens."""
    out = []
    for i in range(len(LAYOUT)):
        c = KVCache()
        k = mx.random.normal((1, HEADS, n, DIM), key=mx.random.key(seed * 10 + i))
        c.keys, c.values, c.offset = k, k + 1, n
        out.append(c)
    return out


def window_layers(n: int, window: int, seed: int = 0) -> list:
    """The same two layers as sliding-window caches of `window` tokens holding `n` (past the
    window they cannot be cut back to a shorter prompt)."""
    out = []
    for i in range(len(LAYOUT)):
        c = RotatingKVCache(max_size=window)
        k = mx.random.normal((1, HEADS, n, DIM), key=mx.random.key(seed * 10 + i))
        c.update_and_fetch(k, k + 1)
        out.append(c)
    return out


def address(x: mx.array) -> int:
    """Where an MLX array's bytes are, as a NumPy view of it (the SSD writer's) sees them."""
    return np.asarray(memoryview(x)).ctypes.data  # type: ignore[arg-type]
