"""The prefill planner's rules: large chunks when idle, a shared budget when busy."""

import pytest

from mlxd.worker.engine.planner import PlanConfig, Prefilling, is_busy, plan_chunk, warmup_shapes

CFG = PlanConfig(idle_chunk=4096, step_budget=1024, min_chunk=64)
LONG = Prefilling(todo=20_000, started=True)


def test_an_idle_batch_prefills_in_large_chunks():
    assert plan_chunk(0, [LONG], CFG) == 4096
    assert plan_chunk(0, [Prefilling(20_000, started=False)], CFG) == 4096
    # A prompt shorter than the idle chunk is prefilled whole, in one forward.
    assert plan_chunk(0, [Prefilling(2100, started=False)], CFG) == 2100


def test_decoding_rows_bound_the_step_to_the_budget():
    assert plan_chunk(1, [LONG], CFG) == 1024
    assert plan_chunk(31, [LONG], CFG) == 1024
    assert is_busy(1, [LONG]) and not is_busy(0, [LONG])


def test_a_newcomer_behind_a_running_prefill_makes_the_step_short():
    new = Prefilling(todo=4, started=False)
    assert is_busy(0, [LONG, new])
    # Right padding makes every row cost the longest chunk: the budget is shared.
    assert plan_chunk(0, [LONG, new], CFG) == 512
    # Several new prompts at once on an idle batch: still one large batched forward.
    assert not is_busy(0, [Prefilling(9000, False), Prefilling(9000, False)])
    assert plan_chunk(0, [Prefilling(9000, False), Prefilling(9000, False)], CFG) == 2048


def test_the_share_never_drops_below_min_chunk():
    rows = [Prefilling(5000, True) for _ in range(32)]
    assert plan_chunk(1, rows, CFG) == 64
    assert plan_chunk(0, rows, CFG) == 128


def test_the_chunk_is_no_longer_than_the_longest_prompt_left():
    assert plan_chunk(3, [Prefilling(10, True), Prefilling(200, True)], CFG) == 200
    assert plan_chunk(3, [Prefilling(0, True), Prefilling(7, True)], CFG) == 7  # 0: decoding
    assert plan_chunk(2, [], CFG) == 4096  # nothing to prefill: the value is not used


def test_plan_config_bounds():
    with pytest.raises(ValueError):
        PlanConfig(step_budget=32, min_chunk=64)
    with pytest.raises(ValueError):
        PlanConfig(idle_chunk=0)


def test_warmup_shapes_follow_the_plan_and_the_context():
    chunks, buckets = warmup_shapes(CFG, 32, 32768, small=False)
    assert chunks == [512, 64] and buckets == [1, 2, 4, 8, 16, 32]  # bounded for big models
    chunks, buckets = warmup_shapes(CFG, 12, 1024, small=False)
    assert chunks == [256, 64] and buckets == [1, 2, 4, 8, 12]  # a quarter of the context
    assert warmup_shapes(CFG, 32, 4096, small=True) == ([16], [1, 2])
    assert warmup_shapes(CFG, 1, 4096, small=True) == ([16], [1])
    assert warmup_shapes(PlanConfig(step_budget=8, min_chunk=8), 4, 64, True) == ([8], [1, 2])


# The 8B shape (32 query heads, bf16, with the softmax's copy: 128 bytes per pair), 13 GB.
BOUNDED = PlanConfig(idle_chunk=4096, step_budget=4096, scores_bytes=13 * 10**9, pair_bytes=128)


def _scores(rows, chunk) -> int:
    return len(rows) * chunk * (max(r.pos for r in rows) + chunk) * 128


def test_long_prompts_prefilled_together_get_chunks_whose_scores_fit_the_bound():
    # Two agents' 100k-token prompts, 90k of each in the cache: the budget's 2048-token
    # chunks would materialize 47 GB of scores per layer.
    rows = [Prefilling(10_000, True, pos=90_000) for _ in range(2)]
    assert _scores(rows, 2048) > BOUNDED.scores_bytes
    chunk = plan_chunk(0, rows, BOUNDED)
    assert _scores(rows, chunk) <= BOUNDED.scores_bytes < _scores(rows, 2 * chunk)
    # Early in the same prompts the budget's chunk fits and stands.
    early = [Prefilling(90_000, True, pos=4096) for _ in range(2)]
    assert plan_chunk(0, early, BOUNDED) == 2048


def test_one_row_and_unbounded_plans_are_not_cut():
    assert plan_chunk(0, [Prefilling(30_000, True, pos=100_000)], BOUNDED) == 4096
    rows = [Prefilling(10_000, True, pos=90_000) for _ in range(2)]
    assert plan_chunk(0, rows, PlanConfig(idle_chunk=4096, step_budget=4096)) == 2048


def test_the_bound_never_cuts_below_the_smallest_chunk():
    rows = [Prefilling(9000, True, pos=1_000_000) for _ in range(8)]
    assert plan_chunk(0, rows, BOUNDED) == BOUNDED.min_chunk
