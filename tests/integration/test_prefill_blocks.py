"""Prefill in whole blocks (worker/model/blocks.py, CUDA's default, forced here on the CPU):
sessions extending cached prefixes of any length give mlx-lm's own greedy tokens, and every
prefill attention call the fused kernel gets is whole blocks of queries and keys in a few
batch sizes, so cuDNN meets a few shapes instead of one per history."""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
from engine_runs import assert_greedy, greedy_run, second_turns
from mlx_lm.models.cache import BatchKVCache

from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.sched.planner import PlanConfig
from mlxd.worker.model import attention, blocks
from mlxd.worker.model.load import load_model, use_blocks

FUSED = attention._fused
BLOCK = 16
OUT = 5


@pytest.fixture
def restore():
    yield
    mx.fast.scaled_dot_product_attention = FUSED
    attention.small_scores_bytes = attention.SMALL_SCORES_CAP
    blocks.set_block(0)


def test_whole_block_rows_go_to_the_fused_kernel_in_powers_of_two_with_mlxs_numbers(restore):
    blocks.set_block(4)
    attention.causal_when_unpadded()
    cache = BatchKVCache([0, 4, 4, 4, 8])  # rows of 12, 8, 8, 8 and 4 cached tokens
    mx.random.seed(3)
    cache.update_and_fetch(mx.random.normal((5, 2, 12, 8)), mx.random.normal((5, 2, 12, 8)))
    mask = cache.make_mask(4)
    q = mx.random.normal((5, 4, 4, 8))
    k, v = cache.update_and_fetch(mx.random.normal((5, 2, 4, 8)), mx.random.normal((5, 2, 4, 8)))
    pieces = attention._in_blocks(q, k, mask)
    assert pieces == [(0, 1, 0), (1, 3, 4), (3, 4, 4), (4, 5, 8)]
    got = attention.in_pieces(q, k, v, 0.3, pieces)
    want = FUSED(q, k, v, scale=0.3, mask=mask)  # MLX's own, with the array mask
    assert mx.allclose(got, want, atol=1e-5).item()
    # A row whose keys are not whole blocks, or queries that are not: MLX's routes as before.
    assert attention._in_blocks(q[:, :, :3], k[..., 1:, :], "causal") is None
    assert attention._in_blocks(q, k[..., 1:, :], "causal") is None
    blocks.set_block(0)
    assert attention._in_blocks(q, k, mask) is None


def test_sessions_extending_cached_prefixes_give_mlx_lms_tokens_in_few_shapes(
    tiny_model_dir, restore, monkeypatch
):
    loaded = load_model(tiny_model_dir, "tiny")
    rng = random.Random(11)
    shared = [rng.randrange(10, 2000) for _ in range(70)]  # not whole blocks
    turn1 = [shared + [rng.randrange(10, 2000) for _ in range(n)] for n in (9, 23, 41)]
    shapes: list[tuple[int, int, int]] = []

    def record(q, k, v, **kw):
        if q.shape[2] > 1:
            shapes.append((q.shape[0], q.shape[2], k.shape[2]))
        return FUSED(q, k, v, **kw)

    monkeypatch.setattr(attention, "_fused", record)
    attention.route_on_cuda(force=True)
    use_blocks(BLOCK)
    engine = Engine(
        loaded,
        batch=8,
        plan=PlanConfig(idle_chunk=64, step_budget=64, min_chunk=8, block=BLOCK),
        cache=PromptCache(1 << 30, None, 0),
        warmup=False,
    )
    prompts = {f"s{i}": p for i, p in enumerate(turn1)}
    new = {f"s{i}": [rng.randrange(10, 2000) for _ in range(5 + 7 * i)] for i in range(3)}
    turn2, second = second_turns(engine, prompts, new, run, shapes.clear)
    assert_greedy(loaded.model, turn2, second, OUT)
    assert shapes  # the prefills went through the fused kernel
    assert all(n % BLOCK == 0 and s % BLOCK == 0 for _, n, s in shapes), shapes
    assert {b for b, _, _ in shapes} <= {1, 2, 4, 8}
    cached = engine.cache.ram.stats["hit_tokens"]
    assert cached > 0


def run(engine: Engine, prompts: dict[str, list[int]]) -> dict[str, list[int]]:
    got, subs = greedy_run(engine, prompts, OUT)
    for sub in subs:  # each hit was cut to whole blocks
        assert sub.prompt_cached % BLOCK == 0, (sub.rid, sub.prompt_cached)
    return got


def test_blocks_are_off_unless_set_on_cuda_and_for_caches_that_are_not_plain(
    tiny_model_dir, restore, monkeypatch
):
    from mlx_lm.models.cache import RotatingKVCache

    from mlxd.worker.model import load

    model = load_model(tiny_model_dir, "tiny").model
    assert load.choose_block(model, None) == 0  # off by default
    assert load.choose_block(model, 256) == 0  # the CPU builds no graphs: never here
    monkeypatch.setattr(blocks, "ANY_DEVICE", True)
    assert load.choose_block(model, 256) == 256
    monkeypatch.setattr(load, "make_prompt_cache", lambda m: [RotatingKVCache(max_size=8)])
    assert load.choose_block(model, 256) == 0  # a sliding window's cache: its own rules
