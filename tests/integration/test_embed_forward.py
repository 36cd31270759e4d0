"""Embedding forwards on the tiny embedding model, in process: every pooling gives the same
vector whether its input runs alone, in a padded batch, or in chunks over a KV cache."""

from __future__ import annotations

import random

import mlx.core as mx
import numpy as np
import pytest

from mlxd.shared.model_facts import read_model_facts
from mlxd.worker.embed.forward import EmbedRun
from mlxd.worker.embed.load import load_embedder
from mlxd.worker.embed.plan import Forward, plan_forwards

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello",
    "Water boils at 100 degrees Celsius (212 degrees Fahrenheit) at sea level.",
    "a b c",
]


@pytest.fixture(scope="module")
def loaded(tiny_embedding_dir):
    facts = read_model_facts(tiny_embedding_dir, "qe")
    return load_embedder(tiny_embedding_dir, "qe", facts), facts


def _embed(model, tokens, pooling, budget, rows=32):
    run = EmbedRun(model, tokens, pooling)
    for fwd in plan_forwards([len(t) for t in tokens], budget, rows):
        run.step(fwd)
    return np.stack(run.vectors)


def test_headless_load_of_a_flat_checkpoint(loaded):
    m, facts = loaded
    assert (facts.type, facts.pooling, facts.hidden_size) == ("embedding", "last", 256)
    assert "lm_head" not in m.model  # dropped: embeddings never use it
    ids = m.tokenizer.encode("Hello")
    assert ids[-1] == m.tokenizer.convert_tokens_to_ids("<|endoftext|>")


@pytest.mark.parametrize("pooling", ["last", "mean", "cls"])
def test_batched_chunked_and_single_vectors_agree(loaded, pooling):
    m, _ = loaded
    tokens = [m.tokenizer.encode(t) for t in TEXTS]
    single = np.stack([_embed(m.model, [t], pooling, 4096)[0] for t in tokens])
    batched = _embed(m.model, tokens, pooling, 4096)
    chunked = _embed(m.model, tokens, pooling, 5, rows=2)  # long inputs split in 5-token chunks
    np.testing.assert_allclose(batched, single, atol=1e-4)
    np.testing.assert_allclose(chunked, single, atol=1e-4)
    assert single.shape == (len(TEXTS), 256) and single.dtype == np.float32
    if pooling != "cls":  # distinct texts, distinct vectors
        assert np.abs(single[0] - single[2]).max() > 1e-2


def test_same_input_same_vector(loaded):
    m, _ = loaded
    ids = m.tokenizer.encode(TEXTS[0])
    runs = [EmbedRun(m.model, [ids], "last") for _ in range(2)]
    for r in runs:
        r.step(Forward((0,)))
    assert np.array_equal(runs[0].vectors[0], runs[1].vectors[0])


def test_a_finished_request_gives_its_buffers_back(loaded):
    """Requests of many shapes leave nothing in MLX's buffer cache (a soak grew an embedding
    worker from 161 to 344 MB that way, never given back)."""
    m, _ = loaded
    rng = random.Random(0)
    for _ in range(6):
        tokens = [
            [rng.randrange(10, 2000) for _ in range(rng.randrange(5, 200))]
            for _ in range(rng.randrange(1, 6))
        ]
        vectors = _embed(m.model, tokens, "last", budget=256, rows=4)
        assert vectors.shape[0] == len(tokens)
        assert mx.get_cache_memory() < 64 << 10, mx.get_cache_memory()
