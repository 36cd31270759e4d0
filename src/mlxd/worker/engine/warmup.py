"""Warm-up before READY: the prefill and decode shapes the engine will use run once.

MLX compiles a GPU kernel the first time it meets a shape family, so without this the first
users pay for it (a first 512-token request took seconds more than the next one). Runs on the
engine thread (the streams are its own) with a throwaway generator: nothing reaches the prompt
cache or the engine's counters.
"""

from __future__ import annotations

import functools
import logging
import time

import mlx.core as mx

from mlxd.shared.params import GenerationParams
from mlxd.worker.engine.sched.planner import PlanConfig, warmup_shapes
from mlxd.worker.engine.step.generator import make_generator
from mlxd.worker.engine.step.sampling import RowSampling, make_row_processors
from mlxd.worker.engine.step.speculate import SpecConfig
from mlxd.worker.model import mlx_lm_seam as seam

log = logging.getLogger("mlxd.worker.engine.loop")

# A sampled, seeded, penalised row beside greedy ones: the batched sampler's filters, seeded
# noise, bias and penalty kernels.
SAMPLED = GenerationParams(
    max_tokens=2,
    temperature=0.7,
    top_p=0.9,
    top_k=20,
    min_p=0.05,
    seed=0,
    repetition_penalty=1.1,
    presence_penalty=0.1,
    frequency_penalty=0.1,
    logit_bias={0: -1.0},
)
MAX_STEPS = 10_000  # a bound on one shape's loop, whatever the generator does


def warm_up(
    model, stream, plan: PlanConfig, batch: int, context_limit: int, spec=None, compiled=False
) -> int:
    """Run every shape once; returns the steps it took. The CPU runs small shapes only: it
    has no GPU kernels to compile, and the code paths are the same. With `spec` (a
    SpecConfig), a lone row on a repeating prompt also runs the verify forward; `compiled`:
    the decode forward the engine will run (compiled.py)."""
    chunks, buckets = warmup_shapes(plan, batch, context_limit, mx.default_device() == mx.cpu)
    make = functools.partial(make_generator, model, stream=stream, compiled=compiled)
    gen = make(batch=batch, chunk=max(chunks))
    steps = 0
    try:
        for c in chunks:
            # One row in two chunks (a causal mask, then one at an offset), then two rows of
            # unequal lengths (right padding; still "causal": no row is left-padded).
            steps += _run(gen, _prompts([2 * c + 1]), c)
            steps += _run(gen, _prompts([c + 1, c // 2 + 1]), c)
        for b in buckets:
            samplers = [RowSampling(GenerationParams(temperature=0.0)) for _ in range(b)]
            if b > 1:
                samplers[-1] = RowSampling(SAMPLED)
            processors = [make_row_processors(s, []) for s in samplers]
            # The first row leaves a step before the others: the batch's caches and arrays
            # are filtered while rows go on (a gather per layer; down to one row, the move to
            # plain caches), as whenever a request ends beside others.
            lengths = [2] + [3] * (b - 1)
            steps += _run(gen, _prompts([4] * b), max(chunks), lengths, samplers, processors)
        if spec is not None:
            gen.close()
            own = SpecConfig(spec.mode, spec.k, spec.draft_model)  # not the engine's counters
            gen = make(batch=batch, chunk=max(chunks), spec=own)
            prompt = [1 + i % 3 for i in range(24)]  # drafts for prompt lookup too
            steps += _run(gen, [prompt], max(chunks), 3 * spec.k)
    finally:
        gen.close()
        mx.clear_cache()
    return steps


def _prompts(lengths: list[int]) -> list[list[int]]:
    """Distinct throwaway prompts of these lengths."""
    return [[(7 * i + j) % 100 + 1 for j in range(n)] for i, n in enumerate(lengths)]


def _run(
    gen, prompts, chunk, max_tokens: int | list[int] = 1, samplers=None, processors=None
) -> int:
    n = len(prompts)
    limits = max_tokens if isinstance(max_tokens, list) else [max_tokens] * n
    gen.insert(prompts, limits, samplers=samplers, logits_processors=processors)
    left, steps = len(prompts), 0
    while left and steps < MAX_STEPS:
        seam.set_prefill_chunk(gen, chunk)
        _, responses = gen.next()
        left -= sum(1 for r in responses if r.finish_reason is not None)
        steps += 1
    return steps


def timed_warm_up(
    model, stream, plan: PlanConfig, batch: int, context_limit: int, spec=None, compiled=False
) -> float:
    """warm_up, logged; a failure is logged and skipped (warm-up only saves time later)."""
    t0 = time.monotonic()
    try:
        steps = warm_up(model, stream, plan, batch, context_limit, spec, compiled)
    except Exception:
        log.exception("warm-up failed; serving without it")
        return 0.0
    took = time.monotonic() - t0
    log.info("warm-up %.2fs (%d steps, batch %d)", took, steps, batch)
    return took
