"""The RAM prompt cache counts the memory it really holds (the engine in process).

What /stats reports as `ram_bytes`, and what `prompt_cache_bytes` caps, is the sum of the
entries' `nbytes`; MLX's own active memory must grow by that much and no more. A finished
lone row's cache is a slice of its 256-token-step buffer, so an entry kept as that slice held
the whole buffer: 48 short prompts counted 2.9 MB while MLX grew 51.7 MB.
"""

from __future__ import annotations

import gc
import threading

import mlx.core as mx
import pytest

from mlxd.shared.params import GenerationParams
from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.rows import Submission
from mlxd.worker.model.load import load_model

# Counted bytes and MLX's growth may differ by this share of the counted bytes (allocator
# rounding, a step's small arrays); the uncounted buffers this guards against were 17x.
TOLERANCE = 0.10


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    # Float KV: a quantized entry's scales and biases are arrays of a few hundred bytes here,
    # whose allocator overhead no byte count sees (see docs/prompt-cache.md).
    return load_model(tiny_model_dir, "tiny")


def prompt(first: int, extra: int = 0) -> list[int]:
    """A short prompt of its own (64 tokens and `extra`): a far smaller row than its buffer."""
    return [first, *range(7, 70 + extra)]


def run(engine: Engine, prompts: list[list[int]], together: bool, max_tokens=lambda i: 8):
    """Generate for `prompts`, one at a time or all queued at once; wait for every end."""
    ends = []
    for i, prompt in enumerate(prompts):
        end = threading.Event()

        def sink(ev, end=end):
            if ev.finish_reason is not None:
                end.set()

        params = GenerationParams(
            max_tokens=max_tokens(i), temperature=0.0, top_p=1.0, top_k=0, min_p=0.0
        )
        engine.submit(Submission(f"r{i}", prompt, params, sink))
        if together:
            ends.append(end)
        else:
            assert end.wait(60)
    for end in ends:
        assert end.wait(60)


def active_bytes(engine: Engine) -> int:
    """MLX's active memory once the engine thread is idle between steps (an inbox command
    it answers is the barrier: every row's hand-off to the cache is done by then)."""
    assert engine.close_session("no-such-session").wait(60)
    # The cache a previous measure replaced may sit in a reference cycle: free it now, not
    # whenever the collector next runs (mid-measure, it read as MLX shrinking by 11 MB).
    gc.collect()
    mx.clear_cache()
    return mx.get_active_memory()


def fresh(engine: Engine, ram_bytes: int) -> PromptCache:
    engine.cache = engine._batch.cache = PromptCache(ram_bytes, None, 0)
    return engine.cache


@pytest.fixture(scope="module")
def engine(loaded):
    engine = Engine(loaded, batch=8, cache=PromptCache(1 << 30, None, 0), warmup=False)
    engine.start()
    run(engine, [[3, 4, 5, 6]], together=False)  # first-use allocations, outside the measures
    run(engine, [[3, 4, 5, 7], [3, 4, 9, 9], [3, 9, 9, 9]], together=True)
    yield engine
    engine.stop()
    assert engine.join(30)


def assert_counted(grew: int, counted: int) -> None:
    assert counted > 0
    assert abs(grew - counted) <= TOLERANCE * counted, f"counted {counted}, MLX grew {grew}"


def test_lone_rows_count_what_they_hold(engine):
    cache = fresh(engine, 1 << 30)
    before = active_bytes(engine)
    run(engine, [prompt(100 + i) for i in range(48)], together=False)
    assert len(cache.ram) == 48
    assert_counted(active_bytes(engine) - before, cache.ram.nbytes)


def test_batched_rows_count_what_they_hold(engine):
    cache = fresh(engine, 1 << 30)
    before = active_bytes(engine)
    # Rows of different lengths leave the batch at different steps (the last one alone).
    prompts = [[200 + i, 7, 8, 9, 10 + i, 11, 12, 13 + i % 5] for i in range(48)]
    run(engine, prompts, together=True, max_tokens=lambda i: 3 + i % 11)
    assert len(cache.ram) == 48
    assert_counted(active_bytes(engine) - before, cache.ram.nbytes)


def test_prompt_cache_bytes_bounds_real_memory(engine):
    """A cap of a few entries holds MLX's growth to the cap, however many prompts pass."""
    cache = fresh(engine, 1 << 30)
    run(engine, [prompt(300)], together=False)
    one_entry = cache.ram.nbytes
    cap = 4 * one_entry
    cache = fresh(engine, cap)
    before = active_bytes(engine)
    run(engine, [prompt(400 + i) for i in range(48)], together=False)
    assert cache.ram.stats["evictions"] > 0 and cache.ram.nbytes <= cap
    assert active_bytes(engine) - before <= (1 + TOLERANCE) * cap
