"""The compiled decode forward (engine/compiled.py) changes no token, and a model it cannot
compile, or compiles wrongly, decodes on the plain forward instead.

In process, on the tiny model: rows of unequal lengths (left padding), rows that join and
leave mid-way, and rows long enough that the KV buffers grow past several 256-position steps.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache, BatchKVCache, CacheList, KVCache, QuantizedKVCache

from mlxd.shared.params import GenerationParams
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.step import compiled
from mlxd.worker.engine.step.compiled import CompiledStep, for_model
from mlxd.worker.engine.step.generator import make_generator
from mlxd.worker.engine.step.sampling import RowSampling
from mlxd.worker.model.load import load_model

# (prompt length, tokens to generate, the step it joins at)
ROWS = [(40, 300, 0), (300, 60, 0), (5, 260, 0), (120, 120, 30), (9, 40, 150), (500, 40, 160)]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(tiny_model_dir, "tiny")


_PLAIN: dict[tuple, list[list[int]]] = {}  # the plain forward's tokens, the oracle of every test


def _decode(model, rows, compiled, sampled=False) -> list[list[int]]:
    """Every row's tokens, rows inserted at their step; `compiled` False: the plain forward
    (computed once per model, rows and sampling: it is the same answer each time)."""
    key = (id(model), tuple(rows), sampled)
    if not compiled and key in _PLAIN:
        return _PLAIN[key]
    tokens = _run(model, rows, compiled, sampled)
    if not compiled:
        _PLAIN[key] = tokens
    return tokens


def _run(model, rows, compiled, sampled) -> list[list[int]]:
    stream = mx.default_stream(mx.default_device())
    gen = make_generator(model, batch=8, chunk=256, stream=stream, compiled=compiled)
    out: dict[int, list[int]] = {}
    order: list[int] = []
    pending = sorted(range(len(rows)), key=lambda i: rows[i][2])
    step = left = 0
    try:
        while pending or left:
            while pending and rows[pending[0]][2] <= step:
                i = pending.pop(0)
                length, n, _ = rows[i]
                prompt = [(7 * i + j) % 100 + 1 for j in range(length)]
                params = GenerationParams(temperature=0.8, seed=i) if sampled else None
                samplers = [RowSampling(params)] if params else None
                (uid,) = gen.insert([prompt], [n], samplers=samplers)
                out[uid] = []
                order.append(uid)
                left += 1
            _, responses = gen.next()
            for r in responses:
                out[r.uid].append(r.token)
                left -= r.finish_reason is not None
            step += 1
    finally:
        gen.close()
    return [out[u] for u in order]


def test_a_lone_row_decodes_the_same_tokens_compiled(loaded):
    rows = [(30, 500, 0)]  # past two buffer steps
    assert _decode(loaded.model, rows, True) == _decode(loaded.model, rows, False)
    step = for_model(loaded.model)
    assert step.off is None and KVCache in step.checked  # it did run compiled (the CPU)


@pytest.mark.parametrize(
    "sampled", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["greedy", "seeded"]
)
def test_rows_that_join_and_leave_decode_the_same_tokens_compiled(loaded, sampled):
    plain = _decode(loaded.model, ROWS, False, sampled)
    assert [len(t) for t in plain] == [n for _, n, _ in ROWS]
    assert _decode(loaded.model, ROWS, True, sampled) == plain
    step = for_model(loaded.model)
    assert step.off is None and BatchKVCache in step.checked


def test_traced_shapes_stay_bounded_and_tokens_stay_the_same(loaded, monkeypatch):
    monkeypatch.setattr(compiled, "MAX_SHAPES", 2)
    model = _Wrapped(loaded.model, lambda logits, cache: logits)  # a step of its own
    assert _decode(model, ROWS, True) == _decode(loaded.model, ROWS, False)
    step = for_model(model)
    assert step.off is None and 0 < len(step.shapes) <= 2


def test_the_warm_up_compiles_only_when_the_engine_does(tiny_model_dir):
    for on in (False, True):
        fresh = load_model(tiny_model_dir, "tiny")
        engine = Engine(fresh, batch=4, compile_decode=on)
        engine.start()
        assert engine.warmed.wait(120)
        engine.stop()
        assert engine.join(30)
        assert (getattr(fresh.model, compiled.ATTR, None) is not None) is on


class _Wrapped:
    """The tiny model behind a forward of our own (what another architecture might do)."""

    def __init__(self, model, tweak):
        self.model, self.tweak = model, tweak
        self.layers = model.layers

    def __call__(self, inputs, cache=None):
        return self.tweak(self.model(inputs, cache=cache), cache)


def test_a_model_whose_forward_cannot_be_traced_decodes_plain(loaded):
    def python_offset(logits, cache):
        off = cache[0].offset  # read back as a Python number: cannot be traced
        return logits + 0 * (off if isinstance(off, int) else off.max().item())

    model = _Wrapped(loaded.model, python_offset)
    rows = ROWS[:3]
    assert _decode(model, rows, True) == _decode(loaded.model, rows, False)
    assert "cannot be traced" in for_model(model).off


def test_a_model_that_compiles_to_other_logits_is_caught_and_decodes_plain(loaded):
    def differs(logits, cache):  # traceable, but not the same function compiled
        return -logits if type(cache[0]).__module__.endswith("compiled") else logits

    model = _Wrapped(loaded.model, differs)
    rows = ROWS[:3]
    assert _decode(model, rows, True) == _decode(loaded.model, rows, False)
    assert "differ" in for_model(model).off


def test_caches_it_cannot_compile_take_the_plain_forward(loaded):
    step = CompiledStep(loaded.model)
    assert not step.usable([])
    assert not step.usable([KVCache()])  # nothing written yet
    q = QuantizedKVCache()
    q.keys = mx.zeros((1, 1, 1, 1))
    assert not step.usable([q])
    # Recurrent (Mamba-style) and list caches have no `keys` at all.
    assert not step.usable([ArraysCache(2)])
    assert not step.usable([CacheList(KVCache(), KVCache())])
    written = KVCache()
    written.update_and_fetch(mx.zeros((1, 1, 4, 8)), mx.zeros((1, 1, 4, 8)))
    assert not step.usable([written, ArraysCache(2)])  # a hybrid: every layer must be plain KV


def test_the_warm_up_runs_a_row_leaving_while_others_decode(tiny_model_dir, monkeypatch):
    # A request ending beside others filters the batch's caches (a gather per layer): a path
    # the GPU compiles on first use, so the warm-up takes it before READY.
    from mlxd.worker.engine.step.decode import DecodeBatch

    partial = []
    real = DecodeBatch.filter

    def spy(self, keep):
        if 0 < len(keep) < len(self.uids):
            partial.append((len(self.uids), len(keep)))
        return real(self, keep)

    monkeypatch.setattr(DecodeBatch, "filter", spy)
    engine = Engine(load_model(tiny_model_dir, "tiny"), batch=4)
    engine.start()
    assert engine.warmed.wait(120)
    engine.stop()
    assert engine.join(30)
    assert (2, 1) in partial  # two rows, one leaves: the other goes on alone
