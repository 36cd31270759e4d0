"""The prefill planner's rules: large chunks when idle, a shared budget when busy."""

import pytest

from mlxd.worker.engine.sched.planner import (
    PlanConfig,
    Prefilling,
    PrefillPace,
    is_busy,
    plan_chunk,
    warmup_shapes,
    window_chunk,
)

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


def test_a_sliding_window_model_prefills_in_chunks_of_its_window():
    assert window_chunk(4096, 0) == 4096  # no window layers: the device's default
    assert window_chunk(4096, 1024) == 1024  # gemma3: 16k prompt 1.91 -> 1.68 s, half the peak
    assert window_chunk(4096, 4096) == 4096  # gemma2's 4,096-token window: unchanged
    assert window_chunk(4096, 8192) == 4096  # never above the device's default
    assert window_chunk(4096, 128) == 4096  # gpt-oss: small windows keep the default
    assert window_chunk(512, 1024) == 512  # the CPU's smaller default stays


def test_a_busy_step_is_sized_to_the_time_target_at_the_measured_pace():
    """Issue 33's step-time target: on the CPU a 512-token chunk deep in a long prompt took
    ~8 s, and a decoding row waited that long for each token. Steps are reported as measured
    (tokens, seconds); no clock here."""
    pace = PrefillPace()
    assert pace.tokens_in(1.0) is None  # nothing measured yet: the token budget alone
    pace.observe(512, 8.0)  # 64 tok/s
    paced = pace.tokens_in(1.0)
    assert paced == 64
    assert plan_chunk(1, [LONG], CFG, paced) == 64  # busy: at most a second's worth
    assert plan_chunk(0, [LONG], CFG, paced) == 4096  # idle: no one waits, large chunks
    assert plan_chunk(0, [LONG, Prefilling(4, False)], CFG, paced) == 64  # a newcomer waits
    # Shared by the rows, but never below min_chunk each: a crowded step still progresses.
    assert plan_chunk(1, [LONG, LONG], CFG, paced) == 64
    # A fast pace never lifts the budget past its token bound.
    pace.observe(10_000, 0.01)
    assert plan_chunk(1, [LONG], CFG, pace.tokens_in(1.0)) == 1024
    # The average follows the latest steps (a prompt's chunks slow as its context grows).
    slow = PrefillPace()
    for _ in range(30):
        slow.observe(100, 1.0)
    for _ in range(15):
        slow.observe(100, 4.0)
    assert slow.tokens_in(1.0) == 25
    assert slow.tokens_in(0.0) is None  # no target
    slow.observe(0, 1.0)  # a step that prefilled nothing says nothing
    assert slow.tokens_in(1.0) == 25
