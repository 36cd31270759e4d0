"""The speculative verify's mask must cover exactly the key buffer KVCache hands back."""

from __future__ import annotations

import itertools

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from mlxd.worker.engine.step.speculate import BucketView


def _cache(buffer: int, offset: int) -> KVCache:
    c = KVCache()
    if buffer:
        c.keys = mx.zeros((1, 1, buffer, 4))
        c.values = mx.zeros((1, 1, buffer, 4))
    c.offset = offset
    return c


def test_the_mask_matches_the_buffer_after_every_kind_of_growth():
    # Buffers as the engine meets them: empty, whole steps, and an extracted row's exact
    # length (not a multiple of 256), at offsets on and off a step boundary.
    buffers = [0, 5, 256, 511, 512, 769, 1024]
    seen = 0
    for buffer, offset, n in itertools.product(buffers, range(0, 1030, 1), (1, 3, 5, 9)):
        if offset > buffer or (buffer and offset < buffer - 300):
            continue
        c = _cache(buffer, offset)
        mask = BucketView(c).make_mask(n)
        keys, _ = BucketView(c).update_and_fetch(mx.ones((1, 1, n, 4)), mx.ones((1, 1, n, 4)))
        assert mask.shape == (n, keys.shape[2]), (buffer, offset, n)
        # Each position sees itself and what came before it, never the unwritten tail.
        assert mask[:, : offset + 1].all().item()
        assert not mask[:, offset + n :].any().item()
        seen += 1
    assert seen > 1000
