"""Per-row samplers and logits processors.

Each row gets its own sampler so a seeded request draws from its own PRNG key: the same seed
gives the same text whatever else shares the batch. Unseeded greedy rows share one sampler
object, which lets the batch sample them in a single call.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import (
    apply_min_p,
    apply_top_k,
    apply_top_p,
    greedy_sampler,
    make_logits_processors,
)

from mlxd.shared.params import GenerationParams

Sampler = Callable[[mx.array], mx.array]


def make_row_sampler(params: GenerationParams) -> Sampler:
    """A sampler over log-probabilities of shape (1, vocab), from a row's resolved parameters
    (handed over whole, so a new sampling parameter changes only this module and its source)."""
    temperature, top_p, top_k = params.temperature, params.top_p, params.top_k
    min_p, seed = params.min_p, params.seed
    if temperature == 0:
        return greedy_sampler
    filters = []
    if 0 < top_p < 1.0:
        filters.append(lambda x: apply_top_p(x, top_p))
    if min_p > 0:
        filters.append(lambda x: apply_min_p(x, min_p))
    if top_k > 0:
        filters.append(lambda x: apply_top_k(x, top_k))
    key = mx.random.key(seed) if seed is not None else None
    inv_temp = 1.0 / temperature

    def sample(logprobs: mx.array) -> mx.array:
        nonlocal key
        for f in filters:
            logprobs = f(logprobs)
        if key is None:
            return mx.random.categorical(logprobs * inv_temp)
        key, sub = mx.random.split(key)
        return mx.random.categorical(logprobs * inv_temp, key=sub)

    return sample


def make_row_processors(params: GenerationParams) -> list:
    """Penalties and logit bias for one row (an empty list costs nothing per step)."""
    return make_logits_processors(
        logit_bias=params.logit_bias or None,
        repetition_penalty=params.repetition_penalty,
        presence_penalty=params.presence_penalty or None,
        frequency_penalty=params.frequency_penalty or None,
    )
