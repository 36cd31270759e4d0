"""Causal attention padded to bucketed shapes (worker/model/shape_buckets.py): the same result
as the unpadded call, few shapes for many history lengths, and, through the engine with CUDA's
routing forced on this CPU, sessions extending cached prefixes decode mlx-lm's own greedy
tokens."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from engine_runs import assert_greedy, greedy_run, second_turns

from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.sched.planner import PlanConfig
from mlxd.worker.model import attention, shape_buckets
from mlxd.worker.model.load import load_model

FUSED = attention._fused
OUT = 6


@pytest.fixture
def buckets_on():
    shape_buckets.set_on(True)
    yield
    shape_buckets.set_on(False)
    mx.fast.scaled_dot_product_attention = FUSED
    attention.small_scores_bytes = attention.SMALL_SCORES_CAP


@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize(
    "n,keys", [(3, 9), (5, 70), (17, 300), (40, 41), (64, 64), (2, 1000), (6, 4)]
)
def test_the_padded_call_gives_the_unpadded_calls_result(heads, n, keys):
    h, hkv = heads
    mx.random.seed(n * 1000 + keys)
    q = mx.random.normal((2, h, n, 16))
    k, v = mx.random.normal((2, hkv, keys, 16)), mx.random.normal((2, hkv, keys, 16))
    shapes = []

    def fused(q, k, v, **kw):
        shapes.append((q.shape[2], k.shape[2]))
        return FUSED(q, k, v, **kw)

    got = shape_buckets.causal(fused, q, k, v, 0.25)
    want = FUSED(q, k, v, scale=0.25, mask="causal")
    assert got.shape == want.shape
    assert mx.allclose(got, want, atol=1e-5).item()
    if n > keys:  # a fresh row's left padding: queries that see no key go as they come
        assert shapes == [(n, keys)]
        return
    before, after, padded = shape_buckets.plan(n, keys)
    assert shapes == [(before + n + after, padded)]
    assert padded >= keys and before >= 0 and after == padded - keys


def test_many_history_lengths_meet_few_shapes_and_bounded_padding():
    """Sessions of 6,000 to 8,700 tokens each adding 270: 11 attention shapes, not 2,700; the
    keys grow by at most an eighth, the queries at most fourfold."""
    shapes = set()
    for keys in range(6000, 8700):
        before, after, padded = shape_buckets.plan(270, keys)
        queries = before + 270 + after
        shapes.add((queries, padded))
        assert keys <= padded <= keys * 9 // 8 and queries <= 4 * 270
    assert len(shapes) == 11


def test_sessions_extending_cached_prefixes_decode_mlx_lms_greedy_tokens(
    tiny_model_dir, buckets_on, monkeypatch
):
    """Three sessions share a prefix; their second turns (the reply and new tokens: each a new
    history length) arrive together, are prefilled from the cache through padded calls
    (left-padded rows row by row, every call "large") and decode what mlx-lm generates for the
    same ids alone."""
    loaded = load_model(tiny_model_dir, "tiny")
    rng = random.Random(11)
    prefix = [rng.randrange(10, 2000) for _ in range(120)]
    turn1 = {f"s{i}": prefix + [rng.randrange(10, 2000) for _ in range(20 + 13 * i)]
             for i in range(3)}  # fmt: skip
    padded = []
    causal = shape_buckets.causal

    def record(fused, q, k, v, scale):
        padded.append((q.shape[2], k.shape[2]))
        return causal(fused, q, k, v, scale)

    monkeypatch.setattr(shape_buckets, "causal", record)
    attention.route_on_cuda(force=True)
    attention.small_scores_bytes = 4  # every masked call is "large"
    engine = Engine(
        loaded,
        batch=4,
        plan=PlanConfig(idle_chunk=64, step_budget=256, min_chunk=8),
        cache=PromptCache(1 << 30, None, 0),
        warmup=False,
    )
    new = {sid: [rng.randrange(10, 2000) for _ in range(9 + 7 * i)] for i, sid in
           enumerate(turn1)}  # fmt: skip
    turn2, second = second_turns(engine, turn1, new, _run, padded.clear)
    assert_greedy(loaded.model, turn2, second, OUT)
    assert engine.cache is not None and engine.cache.ram.stats["hit_tokens"] > 0
    assert padded  # the cached turns went through the padded calls


def _run(engine: Engine, prompts: dict[str, list[int]]) -> dict[str, list[int]]:
    return greedy_run(engine, prompts, OUT)[0]


def test_the_worker_setting_turns_them_on_and_off(tiny_model_dir, tmp_path, buckets_on):
    from mlxd.shared.worker_spec import WorkerSpec
    from mlxd.worker.model.load import load_for_spec

    spec = WorkerSpec(model_path=tiny_model_dir, model_id="tiny", socket=tmp_path / "s")
    assert spec.attention_buckets is True
    for want in (False, True):
        load_for_spec(spec.model_copy(update={"attention_buckets": want}))
        assert shape_buckets.on is want
