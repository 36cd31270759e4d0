"""Every model family through the engine in this process: rows batched together, joining a
running batch and wrapping sliding windows give mlx-lm's own greedy tokens on the same ids."""

from __future__ import annotations

import random
import tempfile
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from families import FAMILIES, build_family_model
from family_support import ATTENTION_ONLY, KV_BITS, PREFILL_ONE_AT_A_TIME
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

from mlxd.shared.params import GenerationParams
from mlxd.worker.cache.entry_caches import compact
from mlxd.worker.cache.format import check_layout
from mlxd.worker.cache.kv_arrays import from_numpy, kv_layout, mlx_buffers, to_numpy
from mlxd.worker.cache.ssd import SsdStore
from mlxd.worker.engine.draft_model import spec_config
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.rows import Submission
from mlxd.worker.engine.sched.planner import PlanConfig
from mlxd.worker.kv.scheme import apply_kv_scheme
from mlxd.worker.model.load import load_model
from mlxd.worker.model.prefill_check import padded_prefill_agrees

TOKENS = 8


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    d = build_family_model(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, load_model(d, request.param)


def _want(loaded, prompt):
    steps = generate_step(mx.array(prompt), loaded.model, max_tokens=TOKENS)
    return [int(tok) for tok, _ in steps]


def test_rows_batched_and_joining_give_mlx_lms_greedy_tokens(family):
    name, loaded = family
    rng = random.Random(3)
    lengths = [5, 20, 33, 47, 64, 90, 130, 12]  # around and past the 32-token windows
    prompts = {f"r{i}": [rng.randrange(10, 2000) for _ in range(n)] for i, n in enumerate(lengths)}
    want = {rid: _want(loaded, p) for rid, p in prompts.items()}
    got = {rid: [] for rid in prompts}
    done = {rid: threading.Event() for rid in prompts}

    def sub(rid):
        def sink(ev):
            got[rid] += [e["token_id"] for e in ev.logprobs or []]
            if ev.finish_reason is not None:
                done[rid].set()

        params = GenerationParams(max_tokens=TOKENS, temperature=0.0, logprobs=True)
        return Submission(rid, prompts[rid], params, sink)

    late = ["r6", "r7"]
    engine = Engine(
        loaded,
        batch=8,
        plan=PlanConfig(idle_chunk=32, step_budget=32, min_chunk=8),
        warmup=False,
        trace=lambda st: st.step == 3 and [engine.submit(sub(r)) for r in late],
    )
    engine.start()
    try:
        for rid in prompts:
            if rid not in late:
                engine.submit(sub(rid))
        assert all(d.wait(120) for d in done.values()), name
    finally:
        engine.stop()
    eos = set(loaded.tokenizer.eos_token_ids)
    for rid, tokens in got.items():
        assert tokens == want[rid][: len(tokens)], (name, rid)
        assert len(tokens) == TOKENS or tokens[-1] in eos, (name, rid)  # whole, or to its end


def test_only_a_model_whose_layers_ignore_padding_is_prefilled_one_row_at_a_time(family):
    """On the pinned mlx-lm only nemotron_h's Mamba2 layers read a padded prefill wrong (its
    `_ssm` drops the cache's lengths); the rest may share a prefill forward. The batched test
    above then holds for nemotron_h only because its rows prefill one at a time."""
    name, loaded = family
    assert padded_prefill_agrees(loaded.model) == (name not in PREFILL_ONE_AT_A_TIME)


def test_kv_bits_and_speculation_are_on_where_the_table_says_and_refused_elsewhere(family):
    """docs/model-families.md (tests/family_support.py): attention-only families speculate;
    families with attention KV that mlx-lm quantizes serve rows with kv_bits (a hybrid's
    recurrent states stay float); windows and MLA refuse it at load, saying why."""
    name, loaded = family
    engine = Engine(loaded, batch=2, warmup=False, spec=spec_config("ngram", 3, None))
    assert (engine.spec is not None) == (name in ATTENTION_ONLY), name
    if name not in KV_BITS:
        with pytest.raises(ValueError, match="kv_bits"):
            apply_kv_scheme(loaded.model, 8, group_size=32)
        assert "make_cache" not in vars(loaded.model)  # the model as it was
        return
    try:
        assert apply_kv_scheme(loaded.model, 8, group_size=32).bits == 8
        quantized = Engine(loaded, batch=2, warmup=False)
        events, done = [], threading.Event()

        def sink(ev):
            events.append(ev)
            if ev.finish_reason is not None:
                done.set()

        params = GenerationParams(max_tokens=TOKENS, temperature=0.0)
        quantized.start()
        try:
            for i in range(2):
                quantized.submit(Submission(f"q{i}", list(range(10 + i, 60)), params, sink))
            assert done.wait(60), name
        finally:
            quantized.stop()
            assert quantized.join(30)
        assert all(e.finish_reason in (None, "length", "stop") for e in events), (name, events)
        _restores_to_the_same_logits(loaded.model)  # a quantized entry, too
    finally:
        vars(loaded.model).pop("make_cache", None)  # the shared model's float caches again


def test_an_entry_of_every_layer_kind_restores_to_the_same_next_logits(family):
    _restores_to_the_same_logits(family[1].model)


def _restores_to_the_same_logits(model):
    """The SSD tier's arrays of a row's caches (past the 32-token windows, and a window
    rotated in place by decode steps), checked against the model's layout and made caches
    again, give the logits the caches themselves give."""
    layout = kv_layout(model)
    assert layout is not None
    caches = make_prompt_cache(model)
    model(mx.array([list(range(10, 100))]), cache=caches)
    for t in range(10):
        model(mx.array([[100 + t]]), cache=caches)
    arrays, _, keep = to_numpy(caches)
    check_layout(arrays, layout, 100)
    copies, _, _ = to_numpy(caches, copy=True)  # what the writer reads on CUDA
    assert copies.keys() == arrays.keys()
    assert all(np.array_equal(copies[k], v) for k, v in arrays.items())
    copied = from_numpy({k: v.copy() for k, v in arrays.items()}, layout)
    with tempfile.TemporaryDirectory() as folder:  # and through the SSD store's own read
        store = SsdStore(Path(folder), 1 << 30, layout, mlx_buffers)
        tokens = tuple(range(10, 100)) + tuple(range(100, 110))
        assert store.write("", tokens, arrays, {}, None)
        read = store.read(store.best("", [*tokens, 7])[0])  # a prompt extending the entry
        assert read is not None
        viewed = from_numpy(read, layout)
        _views_of_the_bytes_read(viewed, read)
    step = mx.array([[7]])
    want = model(step, cache=caches)
    assert mx.array_equal(want, model(step, cache=copied))
    assert mx.array_equal(want, model(step, cache=viewed))
    before = {k: v.copy() for k, v in read.items()}
    for t in range(3):  # decode on (windows rotate in place): views as the copies
        nxt = mx.array([[20 + t]])
        assert mx.array_equal(model(nxt, cache=copied), model(nxt, cache=viewed))
    # The read is shared by every request restoring it: decoding wrote nothing into it, and
    # another restore from it starts where the entry did.
    assert all(np.array_equal(before[k], v) for k, v in read.items())
    again = from_numpy(read, layout)
    assert mx.array_equal(want, model(step, cache=again))
    on_device = from_numpy(read, layout, device_copy=True)  # what the read-ahead keeps on CUDA
    assert mx.array_equal(want, model(step, cache=on_device))


def _views_of_the_bytes_read(layers, read: dict) -> None:
    """Every restored tensor lies in memory the SSD read filled: no copy was made."""
    spans = [(a.ctypes.data, a.ctypes.data + a.nbytes) for a in read.values() if a.nbytes]
    for c in layers:
        for _, x in tree_flatten(c.state):
            if isinstance(x, mx.array) and x.size > 1:
                x = x.view(mx.uint16) if x.dtype == mx.bfloat16 else x
                mx.eval(x)
                at = np.asarray(memoryview(x)).ctypes.data
                assert any(lo <= at < hi for lo, hi in spans), (type(c).__name__, x.shape)


def test_a_window_after_a_chunked_prefill_is_kept_to_its_window_with_the_same_logits(family):
    """A chunked prefill leaves a sliding window holding window - 1 + chunk positions; the
    prompt cache keeps (so the SSD tier writes and reads back) only the window, and caches
    continued from that entry, by a prefill chunk then decode steps, give the same logits."""
    model = family[1].model
    layout = kv_layout(model)
    assert layout is not None
    caches = make_prompt_cache(model)
    for a in range(10, 106, 24):  # 96 tokens in chunks of 24: 55-position buffers
        model(mx.array([list(range(a, a + 24))]), cache=caches)
    kept = compact(caches)
    windows = [c for c in kept if type(c) is RotatingKVCache]
    assert all(c.keys.shape[2] == c.max_size for c in windows)
    arrays, _, keep = to_numpy(kept)
    check_layout(arrays, layout, 96)
    restored = from_numpy({k: v.copy() for k, v in arrays.items()}, layout)
    for step in (list(range(200, 210)), [7], [8], [9]):
        want = model(mx.array([step]), cache=caches)
        got = model(mx.array([step]), cache=restored)
        assert mx.array_equal(want, got), step
