"""Small prefills attend unfused on CUDA (worker/attention.py): the same numbers as MLX's own
attention, for every mask kind and grouped heads, and only the small calls are rerouted."""

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


def test_only_small_multi_token_calls_are_rerouted(monkeypatch):
    calls = []
    monkeypatch.setattr(attention, "_fused", lambda *a, **kw: calls.append(a[0].shape) or a[0])
    small = _qkv(1, 4, 4, 8, 8)
    attention.routed(*small, scale=1.0, mask="causal")
    assert calls == []  # computed unfused
    decode = _qkv(1, 4, 4, 1, 8)
    attention.routed(*decode, scale=1.0)
    monkeypatch.setattr(attention, "SMALL_SCORES_BYTES", 4 * 8 * 8 * 4 - 1)
    attention.routed(*small, scale=1.0, mask="causal")
    assert calls == [(1, 4, 1, 16), (1, 4, 8, 16)]  # a decode step, then a call too large


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
