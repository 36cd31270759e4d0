"""Small masked prefills attend unfused on CUDA (worker/attention.py): the same numbers as
MLX's own attention, for every mask kind and grouped heads, and only those calls rerouted."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache

from mlxd.worker.model import attention
from mlxd.worker.model.load import load_model

FUSED = attention._fused


@pytest.fixture
def restore():
    yield
    mx.fast.scaled_dot_product_attention = FUSED
    attention.small_scores_bytes = attention.SMALL_SCORES_CAP


def _qkv(b, h, hkv, n, s, d=16):
    mx.random.seed(b * 100 + h * 10 + n)
    return (
        mx.random.normal((b, h, n, d)),
        mx.random.normal((b, hkv, s, d)),
        mx.random.normal((b, hkv, s, d)),
    )


@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
@pytest.mark.parametrize("kind", ["none", "causal", "bool", "additive"])
def test_unfused_attention_equals_mlxs_own(heads, kind):
    h, hkv = heads
    q, k, v = _qkv(2, h, hkv, 5, 9)
    mask = {
        "none": None,
        "causal": "causal",
        "bool": mx.random.uniform(shape=(2, 1, 5, 9)) > 0.3,
        "additive": mx.random.normal((2, 1, 5, 9)),
    }[kind]
    want = FUSED(q, k, v, scale=0.25, mask=mask)
    got = attention.unfused(q, k, v, 0.25, mask)
    assert got.shape == want.shape
    assert mx.allclose(got, want, atol=1e-5).item()


def test_only_small_masked_calls_are_unfused_and_large_array_masks_go_in_blocks(monkeypatch):
    calls = []
    monkeypatch.setattr(attention, "_fused", lambda *a, **kw: calls.append(a[0].shape) or a[0])
    q, k, v = _qkv(1, 4, 4, 8, 8)
    mask = mx.ones((1, 1, 8, 8), dtype=mx.bool_)
    attention.routed(q, k, v, scale=1.0, mask=mask)
    attention.routed(q, k, v, scale=1.0, mask=mx.zeros((8, 8)))  # additive, q's dtype
    attention.routed(q, k, v, scale=1.0, mask="causal")  # an unpadded prompt batch's
    assert calls == []  # all computed unfused
    kept = [
        dict(mask=None),
        dict(mask=mx.ones((1, 4, 8, 8), dtype=mx.bool_)),  # one mask per head
        dict(mask=mx.zeros((8, 8), dtype=mx.float16)),  # a dtype MLX would cast
        dict(mask=mask, sinks=mx.zeros((4,))),
    ]
    for kw in kept:
        attention.routed(q, k, v, scale=1.0, **kw)
    decode = _qkv(1, 4, 4, 1, 8)
    attention.routed(*decode, scale=1.0, mask=mx.ones((1, 1, 1, 8), dtype=mx.bool_))
    assert len(calls) == len(kept) + 1
    # Past the bound: causal calls take the fused (flash) kernel, array masks go in blocks.
    monkeypatch.setattr(attention, "small_scores_bytes", 4 * 4 * 8 * 4)  # half the scores
    blocks = []
    plain = attention.unfused
    monkeypatch.setattr(attention, "unfused", lambda *a: blocks.append(a[0].shape) or plain(*a))
    attention.routed(q, k, v, scale=1.0, mask="causal")
    assert len(calls) == len(kept) + 2 and blocks == []
    attention.routed(q, k, v, scale=1.0, mask=mask)
    assert len(calls) == len(kept) + 2
    assert [b[2] for b in blocks] == [4, 4]  # two blocks of 4 queries, each within the bound


@pytest.mark.parametrize("shape", [(2, 1, 7, 9), (7, 9), (2, 1, 1, 9)], ids=["rows", "2d", "bcast"])
def test_attention_in_blocks_of_queries_equals_mlxs_own(shape, restore):
    q, k, v = _qkv(2, 8, 2, 7, 9)
    mask = mx.random.uniform(shape=shape) > 0.3
    mask = mask | (mx.arange(9) == 0)  # every query sees a key (no row of -inf)
    want = FUSED(q, k, v, scale=0.25, mask=mask)
    attention.small_scores_bytes = 2 * 8 * 9 * 4 * 3  # three queries a block: 3, 3, 1
    got = attention.blocked(q, k, v, 0.25, mask)
    assert got.shape == want.shape
    assert mx.allclose(got, want, atol=1e-5).item()


def test_an_unpadded_prompt_batch_asks_for_the_causal_kernel(tiny_model_dir):
    load_model(tiny_model_dir, "tiny")  # installs attention.causal_when_unpadded
    fresh = BatchKVCache([0, 0])
    fresh.prepare(lengths=[5, 8], right_padding=[3, 0])  # right padding is never attended
    assert fresh.make_mask(8) == "causal"
    assert isinstance(fresh.make_mask(1), mx.array)  # decode keeps its array
    assert isinstance(fresh.make_mask(8, return_array=True), mx.array)  # a model asking for one
    assert isinstance(fresh.make_mask(8, window_size=4), mx.array)
    assert isinstance(BatchKVCache([0, 3]).make_mask(8), mx.array)  # left padding is masked


def test_a_batch_of_unpadded_and_left_padded_rows_gives_the_array_masks_logits(tiny_model_dir):
    """The causal kernel and mlx-lm's array mask give one answer for a prefill of fresh rows;
    once the shorter row's right padding became left padding, the patched cache hands on
    mlx-lm's own array (a chunk more gives the same logits)."""
    loaded = load_model(tiny_model_dir, "tiny")
    model = loaded.model
    tokens = mx.array([[5 + i for i in range(12)], [9 + i for i in range(12)]])

    def forward() -> list[mx.array]:
        cache = [BatchKVCache([0, 0]) for _ in model.layers]
        for c in cache:
            c.prepare(lengths=[7, 12], right_padding=[5, 0])
        first = model(tokens, cache=cache)
        for c in cache:
            c.finalize()  # the shorter row's right padding becomes left padding
        return [first, model(tokens[:, :4], cache=cache)]

    got = forward()
    patched = BatchKVCache.make_mask
    BatchKVCache.make_mask = attention._array_mask
    try:
        want = forward()
    finally:
        BatchKVCache.make_mask = patched
    for g, w in zip(got, want):
        assert mx.allclose(g, w, atol=1e-4).item()


def test_the_bound_follows_a_small_devices_memory(restore):
    assert attention.route_on_cuda(64 << 20, force=True)
    assert attention.small_scores_bytes == 1 << 20
    mx.fast.scaled_dot_product_attention = FUSED
    assert attention.route_on_cuda(200 << 30, force=True)
    assert attention.small_scores_bytes == attention.SMALL_SCORES_CAP


@pytest.mark.skipif(mx.default_device() == mx.gpu, reason="a GPU host routes for real")
def test_the_cpu_is_left_alone_and_a_routed_model_gives_the_same_logits(
    tiny_model_dir, restore, monkeypatch
):
    assert attention.route_on_cuda() is False
    assert mx.fast.scaled_dot_product_attention is FUSED
    loaded = load_model(tiny_model_dir, "tiny")
    lengths = [7, 12]
    tokens = mx.array([[5 + i for i in range(12)], [9 + i for i in range(12)]])

    def forward():  # a right-padded batched prefill, as mlx-lm's prompt batch runs it
        cache = [BatchKVCache([0, 0]) for _ in loaded.model.layers]
        for c in cache:
            c.prepare(lengths=lengths, right_padding=[12 - n for n in lengths])
        return loaded.model(tokens, cache=cache)

    want = forward()
    unfused_calls = []
    plain = attention.unfused
    monkeypatch.setattr(attention, "unfused", lambda *a: unfused_calls.append(1) or plain(*a))
    assert attention.route_on_cuda(force=True) is True
    assert mx.fast.scaled_dot_product_attention is attention.routed
    got = forward()
    assert len(unfused_calls) == len(loaded.model.layers)  # every layer took the plain path
    assert mx.allclose(got, want, atol=1e-4).item()


def test_a_large_left_padded_batch_attends_row_by_row_as_its_mask_says(
    tiny_model_dir, restore, monkeypatch
):
    """Rows with different histories (two newcomers joining a running prefill: left padding)
    attend through the causal kernel on their own keys, in every layer, the two of one padding
    in one call, and the logits are those of mlx-lm's array mask."""
    loaded = load_model(tiny_model_dir, "tiny")
    model = loaded.model
    mx.random.seed(3)
    tokens = mx.random.randint(0, 100, (3, 14))
    rows, calls = [], []

    def forward() -> mx.array:
        old = [BatchKVCache([0]) for _ in model.layers]
        model(tokens[:1, :6], cache=old)  # a row 6 tokens into its prompt
        new = [BatchKVCache([0, 0]) for _ in model.layers]
        model(tokens[1:, :2], cache=new)  # two rows 2 tokens into theirs
        for c, n in zip(old, new):
            c.extend(n)  # they join it: left-padded by 4, with 2 tokens of their own
        assert old[0].left_padding.tolist() == [0, 4, 4]
        calls.clear()
        return model(tokens[:, 6:], cache=old)

    want = forward()  # MLX's own attention with the array mask
    plain, fused = attention.row_by_row, attention._fused
    monkeypatch.setattr(attention, "row_by_row", lambda *a: rows.append(a[4]) or plain(*a))
    monkeypatch.setattr(
        attention, "_fused", lambda q, *a, **kw: calls.append(q.shape[0]) or fused(q, *a, **kw)
    )
    attention.route_on_cuda(force=True)
    attention.small_scores_bytes = 4  # every call is "large"
    got = forward()
    assert rows == [[0, 4, 4]] * len(model.layers)
    assert calls == [1, 2] * len(model.layers)  # one call per padding
    assert mx.allclose(got, want, atol=1e-4).item()


def test_only_the_mask_the_padded_cache_made_is_read_as_its_padding(restore, monkeypatch):
    calls = []
    monkeypatch.setattr(attention, "row_by_row", lambda *a: calls.append("rows") or a[0])
    monkeypatch.setattr(attention, "blocked", lambda *a: calls.append("blocked") or a[0])
    attention.causal_when_unpadded()
    attention.small_scores_bytes = 4
    cache = BatchKVCache([0, 3])
    mask = cache.make_mask(4)
    q, k, v = _qkv(2, 4, 4, 4, 4)
    attention.routed(q, k, v, scale=1.0, mask=mask)
    attention.routed(q, k, v, scale=1.0, mask=mask[..., 1:])  # another array: no padding known
    attention.routed(q, k, v, scale=1.0, mask=mx.array(mask))
    assert calls == ["rows", "blocked", "blocked"]


def test_the_engine_decodes_what_one_row_alone_would_whatever_path_its_prefill_took(
    tiny_model_dir, restore, monkeypatch
):
    """Greedy tokens of rows admitted together (unpadded: "causal") and of a row joining a
    running prefill (left padding: row by row, every call "large" here) are those of mlx-lm's
    own single-row generation."""
    import random
    import threading

    from mlx_lm.generate import generate_step

    from mlxd.shared.params import GenerationParams
    from mlxd.worker.engine.loop import Engine
    from mlxd.worker.engine.rows import Submission
    from mlxd.worker.engine.sched.planner import PlanConfig

    loaded = load_model(tiny_model_dir, "tiny")
    rng = random.Random(7)
    prompts = {
        rid: [rng.randrange(10, 2000) for _ in range(n)]
        for rid, n in (("a", 150), ("b", 90), ("late", 40))
    }
    want = {}
    for rid, prompt in prompts.items():
        steps = generate_step(mx.array(prompt), loaded.model, max_tokens=6)
        want[rid] = [int(tok) for tok, _ in steps]

    rows, causal_batches = [], []
    plain, fused = attention.row_by_row, attention._fused

    def record_causal(q, *a, mask=None, **kw):
        if isinstance(mask, str):
            causal_batches.append(q.shape[0])
        return fused(q, *a, mask=mask, **kw)

    monkeypatch.setattr(attention, "row_by_row", lambda *a: rows.append(a[4]) or plain(*a))
    monkeypatch.setattr(attention, "_fused", record_causal)
    attention.route_on_cuda(force=True)
    attention.small_scores_bytes = 4
    got = {rid: [] for rid in prompts}
    done = {rid: threading.Event() for rid in prompts}

    def sub(rid: str) -> Submission:
        def sink(ev):
            got[rid] += [e["token_id"] for e in ev.logprobs or []]
            if ev.finish_reason is not None:
                done[rid].set()

        params = GenerationParams(max_tokens=6, temperature=0.0, logprobs=True)
        return Submission(rid, prompts[rid], params, sink)

    engine = Engine(
        loaded,
        batch=4,
        plan=PlanConfig(idle_chunk=32, step_budget=32, min_chunk=8),
        warmup=False,
        trace=lambda st: st.step == 2 and engine.submit(sub("late")),
    )
    engine.start()
    try:
        engine.submit(sub("a"))
        engine.submit(sub("b"))
        assert all(d.wait(120) for d in done.values())
    finally:
        engine.stop()
    assert rows and any(max(left) > 0 for left in rows)  # the late row joined left-padded
    assert 2 in causal_batches  # "a" and "b" were prefilled together as "causal"
    eos = set(loaded.tokenizer.eos_token_ids)
    for rid, tokens in got.items():
        assert tokens == want[rid][: len(tokens)], rid
        assert len(tokens) == 6 or tokens[-1] in eos, rid  # the whole answer, or to its end
