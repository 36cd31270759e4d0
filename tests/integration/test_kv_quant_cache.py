"""The batch quantized KV cache on the tiny model, in process: rows batched through the engine's
generator decode exactly as each alone through mlx-lm's QuantizedKVCache, the cache converts
to and from the plain one, and 8-bit KV keeps the float model's greedy choices."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache

from mlxd.worker.engine.step.generator import make_generator
from mlxd.worker.kv.quant import BatchQuantizedKVCache, QuantizedRowCache, head
from mlxd.worker.model.load import load_model

PROMPTS = [list(range(5, 5 + n)) for n in (7, 40, 13, 90)]
N = 12


@pytest.fixture(scope="module")
def q8(tiny_model_dir):
    return load_model(tiny_model_dir, "tiny", kv_bits=8)


@pytest.fixture(scope="module")
def fp(tiny_model_dir):
    return load_model(tiny_model_dir, "tiny")


def alone(model, prompt: list[int], n: int, bits: int = 8) -> list[int]:
    """Greedy tokens of one row through mlx-lm's own quantized cache, no batch."""
    return _greedy(
        model, prompt, n, [QuantizedKVCache(group_size=64, bits=bits) for _ in model.layers]
    )


def alone_float(model, prompt: list[int], n: int) -> list[int]:
    return _greedy(model, prompt, n, make_prompt_cache(model))


def _greedy(model, prompt: list[int], n: int, cache: list) -> list[int]:
    logits = model(mx.array([prompt]), cache=cache)[:, -1]
    out = []
    for _ in range(n):
        tok = mx.argmax(logits, axis=-1)
        out.append(tok.item())
        logits = model(tok[:, None], cache=cache)[:, -1]
    return out


def batched(model, prompts, n: int, late=None) -> dict[int, list[int]]:
    """Greedy tokens of rows decoded together (prefill in 32-token chunks, so rows are
    right-padded, merged, extended and filtered); `late` joins after a few steps."""
    gen = make_generator(model, batch=8, chunk=32, stream=mx.default_stream(mx.default_device()))
    uids = gen.insert(prompts, max_tokens=[n] * len(prompts))
    out = {u: [] for u in uids}
    steps = 0
    try:
        while any(len(v) < n for v in out.values()):
            steps += 1
            if late is not None and steps == 4:
                out.update({u: [] for u in gen.insert([late], max_tokens=[n])})
            for r in gen.next()[1]:
                out[r.uid].append(r.token)
    finally:
        gen.close()
    return {i: out[u] for i, u in enumerate(sorted(out))}


def test_batched_quantized_rows_decode_as_each_row_alone(q8):
    late = list(range(200, 260))
    got = batched(q8.model, PROMPTS, N, late=late)
    for i, prompt in enumerate([*PROMPTS, late]):
        assert got[i] == alone(q8.model, prompt, N), i


def test_quantized_batch_converts_to_and_from_the_plain_cache(q8, fp):
    rows = []
    for prompt in PROMPTS[:2]:
        cache = make_prompt_cache(q8.model)
        assert isinstance(cache[0], QuantizedRowCache) and cache[0].bits == 8
        q8.model(mx.array([prompt]), cache=cache)
        rows.append(cache)
    merged = [BatchQuantizedKVCache.merge([a, b]) for a, b in zip(*rows)]
    assert merged[0].left_padding.tolist() == [33, 0] and merged[0].size() == 40
    back = [c.extract(0) for c in merged]
    assert isinstance(back[0], QuantizedKVCache) and back[0].offset == 7
    for got, want in zip(back[0].keys, rows[0][0].keys):
        assert mx.array_equal(got, want[..., :7, :])
    # mlx-lm's own quantized cache and a float one (quantized on the way in) merge too.
    plain = [QuantizedKVCache(group_size=64, bits=8) for _ in q8.model.layers]
    floats = make_prompt_cache(fp.model)
    for cache in (plain, floats):
        q8.model(mx.array([PROMPTS[0]]), cache=cache)
    mixed = BatchQuantizedKVCache.merge([plain[0], floats[0], rows[1][0]])
    assert mixed.left_padding.tolist() == [33, 33, 0] and mixed.bits == 8
    for got, want in zip(mixed.extract(0).keys, mixed.extract(1).keys):
        assert mx.array_equal(got, want)  # the same prompt, quantized alike
    # A trimmed batch drops the last positions of every row (speculative decoding's undo).
    assert merged[0].trim(3) == 3 and merged[0].extract(1).offset == 37
    # A lone row's plain cache, cut to what its tokens cover, goes back into a batch.
    lone = head(back[0], 5)
    assert lone.offset == 5 and BatchQuantizedKVCache.merge([lone]).size() == 5
    # Bytes held by one layer: 2 rows x 40 positions at the plan's bytes per token and layer.
    assert merged[0].nbytes == 2 * 40 * q8.kv_bytes_per_token // len(q8.model.layers)


def test_8bit_kv_keeps_the_float_models_greedy_choices(fp, q8):
    # Teacher forced: the float run's tokens are fed through each cache, and each position's
    # top choice compared (a first difference in free decoding changes the rest of its row,
    # which would measure drift, not the cache). 8-bit rounding moves each K and V element by
    # at most half a step of 1/255 of its group's range; on this random model (logits close
    # together) that flips about 3% of choices (bench/kvquant.py measures it), so 90% leaves
    # room for float noise and fails on any real error (a 4-bit cache scores about 65%).
    same = total = 0
    for prompt in PROMPTS:
        ref = alone_float(fp.model, prompt, 24)
        seq = mx.array([prompt + ref[:-1]])
        picks = mx.argmax(q8.model(seq, cache=make_prompt_cache(q8.model))[0], axis=-1)
        picks = picks[len(prompt) - 1 :].tolist()
        same += sum(a == b for a, b in zip(picks, ref))
        total += len(ref)
    assert same / total >= 0.9
