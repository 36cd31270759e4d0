"""The batched sampler (worker/engine/sampling.py): one pass over the batch gives each row what
its own parameters ask for, whatever else shares the batch."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest
from mlx_lm.sample_utils import make_logits_processors

from mlxd.shared.params import GenerationParams
from mlxd.worker.engine.step.sampling import PENALTY_WINDOW, RowSampling, Table, penalize, sample

V = 64


def rows(*params: GenerationParams) -> list[RowSampling]:
    return [RowSampling(p) for p in params]


def logprobs_of(logits: mx.array) -> mx.array:
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def test_greedy_rows_take_the_argmax():
    lp = logprobs_of(mx.random.normal((3, V), key=mx.random.key(1)))
    got = sample(lp, Table.of(rows(*[GenerationParams(temperature=0.0)] * 3), V))
    assert got.tolist() == mx.argmax(lp, axis=-1).tolist()


def test_a_seeded_row_draws_the_same_tokens_alone_or_in_a_batch():
    seeded = GenerationParams(temperature=1.0, seed=42)
    other = GenerationParams(temperature=1.0)
    greedy = GenerationParams(temperature=0.0)
    alone, shared = rows(seeded), rows(other, seeded, greedy)
    t_alone, t_shared = Table.of(alone, V), Table.of(shared, V)
    for step in range(8):
        lp = logprobs_of(mx.random.normal((3, V), key=mx.random.key(step)))
        a = sample(lp[1:2], t_alone).tolist()[0]
        b = sample(lp, t_shared).tolist()
        assert a == b[1], f"step {step}"
        assert b[2] == mx.argmax(lp[2]).item()


def test_filters_that_keep_only_the_top_token_give_the_argmax_per_row():
    lp = logprobs_of(mx.random.normal((4, V), key=mx.random.key(3)) * 3)
    table = Table.of(
        rows(
            GenerationParams(temperature=1.0, top_k=1),
            GenerationParams(temperature=1.0, top_p=1e-6),
            GenerationParams(temperature=1.0, min_p=0.999999),
            GenerationParams(temperature=5.0),  # no filter: draws widely
        ),
        V,
    )
    argmax = mx.argmax(lp, axis=-1).tolist()
    draws = [sample(lp, table).tolist() for _ in range(30)]
    for i in range(3):
        assert {d[i] for d in draws} == {argmax[i]}
    assert len({d[3] for d in draws}) > 5


def test_top_k_keeps_the_k_most_likely_tokens():
    lp = logprobs_of(mx.arange(V, dtype=mx.float32).reshape(1, V) / 4)
    table = Table.of(rows(GenerationParams(temperature=100.0, top_k=3)), V)
    drawn = {sample(lp, table).item() for _ in range(60)}
    assert drawn == {V - 1, V - 2, V - 3}


def test_temperature_draws_follow_the_distribution():
    probs = [0.6, 0.3, 0.1]
    lp = mx.log(mx.array([probs + [1e-9] * (V - 3)]))
    table = Table.of(rows(GenerationParams(temperature=1.0, seed=7)), V)
    n = 2000
    counts = [0, 0, 0]
    for _ in range(n // 100):
        batch = sample(mx.repeat(lp, 100, axis=0), Table.of(table.rows * 100, V))
        for tok in batch.tolist():
            counts[tok] += 1
    for c, p in zip(counts, probs):
        assert abs(c / n - p) < 4 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize(
    "params",
    [
        GenerationParams(logit_bias={3: 5.0, 9: -100.0}),
        GenerationParams(repetition_penalty=1.3),
        GenerationParams(presence_penalty=0.7),
        GenerationParams(frequency_penalty=0.4),
        GenerationParams(
            repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.3, logit_bias={1: 2.0}
        ),
        # Ollama's repeat_last_n: a shorter window than the other rows', and a longer one.
        GenerationParams(repetition_penalty=1.3, presence_penalty=0.5, penalty_window=5),
        GenerationParams(frequency_penalty=0.4, presence_penalty=0.2, penalty_window=33),
    ],
)
def test_bias_and_penalties_match_mlx_lm_per_row_processors(params):
    """Batched, each row gets exactly what mlx-lm's own processors give it alone."""
    logits = mx.random.normal((3, V), key=mx.random.key(5)) * 4
    contexts = [[1, 2, 2, 3, 3, 3, 60], list(range(40)), [5, 5, 5, 5]]
    plain = GenerationParams(presence_penalty=0.1)  # a penalised row with the default window
    table = Table.of(rows(params, plain, params), V)
    w = table.width
    window = mx.array([([-1] * w + c[-w:])[-w:] for c in contexts], dtype=mx.int32)
    got = penalize(logits, table, window)
    n = params.penalty_window or PENALTY_WINDOW
    procs = make_logits_processors(
        logit_bias=params.logit_bias or None,
        repetition_penalty=params.repetition_penalty,
        repetition_context_size=n,
        presence_penalty=params.presence_penalty or None,
        presence_context_size=n,
        frequency_penalty=params.frequency_penalty or None,
        frequency_context_size=n,
    )
    for i in (0, 2):
        want = logits[i : i + 1]
        for p in procs:
            want = p(mx.array(contexts[i]), want)
        assert mx.allclose(got[i : i + 1], want, atol=1e-5).item(), i
    (presence,) = make_logits_processors(presence_penalty=0.1)  # window 20
    want = presence(mx.array(contexts[1]), logits[1:2])
    assert mx.allclose(got[1:2], want, atol=1e-5).item()  # the other row keeps its own window
