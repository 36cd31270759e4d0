"""Small masked prefills attend unfused on CUDA (worker/attention.py): the same numbers as
MLX's own attention, for every mask kind and grouped heads, and only those calls rerouted."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache

from mlxd.worker import attention
from mlxd.worker.model import load_model

FUSED = attention._fused


@pytest.fixture
def restore():
    yield
    mx.fast.scaled_dot_product_attention = FUSED
    attention.small_scores_bytes = attention.SMALL_SCORES_CAP


def _qkv(b, h, hkv, n, s, d=16):
    mx.random.seed(b * 100 + h * 10 + n)
    return (
        mx.random.normal((b, h, n, d)),
        mx.random.normal((b, hkv, s, d)),
        mx.random.normal((b, hkv, s, d)),
    )


@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("kind", ["none", "causal", "bool", "additive"])
def test_unfused_attention_equals_mlxs_own(heads, kind):
    h, hkv = heads
    q, k, v = _qkv(2, h, hkv, 5, 9)
    mask = {
        "none": None,
        "causal": "causal",
        "bool": mx.random.uniform(shape=(2, 1, 5, 9)) > 0.3,
        "additive": mx.random.normal((2, 1, 5, 9)),
    }[kind]
    want = FUSED(q, k, v, scale=0.25, mask=mask)
    got = attention.unfused(q, k, v, 0.25, mask)
    assert got.shape == want.shape
    assert mx.allclose(got, want, atol=1e-5).item()


def test_only_small_calls_with_a_plain_array_mask_are_rerouted(monkeypatch):
    calls = []
    monkeypatch.setattr(attention, "_fused", lambda *a, **kw: calls.append(a[0].shape) or a[0])
    q, k, v = _qkv(1, 4, 4, 8, 8)
    mask = mx.ones((1, 1, 8, 8), dtype=mx.bool_)
    attention.routed(q, k, v, scale=1.0, mask=mask)
    attention.routed(q, k, v, scale=1.0, mask=mx.zeros((8, 8)))  # additive, q's dtype
    assert calls == []  # both computed unfused
    kept = [
        dict(mask="causal"),  # a plain cache's prefill: a cheap build, not routed
        dict(mask=None),
        dict(mask=mx.ones((1, 4, 8, 8), dtype=mx.bool_)),  # one mask per head
        dict(mask=mx.zeros((8, 8), dtype=mx.float16)),  # a dtype MLX would cast
        dict(mask=mask, sinks=mx.zeros((4,))),
    ]
    for kw in kept:
        attention.routed(q, k, v, scale=1.0, **kw)
    decode = _qkv(1, 4, 4, 1, 8)
    attention.routed(*decode, scale=1.0, mask=mx.ones((1, 1, 1, 8), dtype=mx.bool_))
    monkeypatch.setattr(attention, "small_scores_bytes", 4 * 8 * 8 * 4)  # not under it
    attention.routed(q, k, v, scale=1.0, mask=mask)
    assert len(calls) == len(kept) + 2


def test_the_bound_follows_a_small_devices_memory(restore):
    assert attention.route_on_cuda(64 << 20, force=True)
    assert attention.small_scores_bytes == 1 << 20
    mx.fast.scaled_dot_product_attention = FUSED
    assert attention.route_on_cuda(200 << 30, force=True)
    assert attention.small_scores_bytes == attention.SMALL_SCORES_CAP


@pytest.mark.skipif(mx.default_device() == mx.gpu, reason="a GPU host routes for real")
def test_the_cpu_is_left_alone_and_a_routed_model_gives_the_same_logits(
    tiny_model_dir, restore, monkeypatch
):
    assert attention.route_on_cuda() is False
    assert mx.fast.scaled_dot_product_attention is FUSED
    loaded = load_model(tiny_model_dir, "tiny")
    lengths = [7, 12]
    tokens = mx.array([[5 + i for i in range(12)], [9 + i for i in range(12)]])

    def forward():  # a right-padded batched prefill, as mlx-lm's prompt batch runs it
        cache = [BatchKVCache([0, 0]) for _ in loaded.model.layers]
        for c in cache:
            c.prepare(lengths=lengths, right_padding=[12 - n for n in lengths])
        return loaded.model(tokens, cache=cache)

    want = forward()
    unfused_calls = []
    plain = attention.unfused
    monkeypatch.setattr(attention, "unfused", lambda *a: unfused_calls.append(1) or plain(*a))
    assert attention.route_on_cuda(force=True) is True
    assert mx.fast.scaled_dot_product_attention is attention.routed
    got = forward()
    assert len(unfused_calls) == len(loaded.model.layers)  # every layer took the plain path
    assert mx.allclose(got, want, atol=1e-4).item()
