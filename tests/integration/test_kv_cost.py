"""What a row's KV costs, for every model family: the worker's measured cost and the config's
arithmetic (what the supervisor's `mlxctl fit` plans with) against the bytes mlx-lm's caches
really hold after a prompt that wraps the sliding windows; and admission counting a window's
tokens at most once the window is full."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from families import FAMILIES, WINDOW, build_family_model
from family_support import RECURRENT
from mlx_lm.models.cache import ArraysCache, CacheList, QuantizedKVCache, make_prompt_cache

from mlxd.shared.fit import dtype_bytes_of
from mlxd.shared.kv_config import kv_cost_of_config
from mlxd.shared.kv_math import KvCost
from mlxd.worker.engine.stats import kv_cost_report
from mlxd.worker.kv.budget import KvBudget
from mlxd.worker.kv.cost import row_cost
from mlxd.worker.model.load import load_model

from tiny_model import build_tiny_model

PROMPT = 300  # past every family's 32-token windows
TOLERANCE = 0.05


def held_bytes(c) -> int:
    """Bytes a layer cache holds for its tokens: K and V up to the positions it keeps (a
    rotating buffer as held, at most its window), recurrent states whole."""
    if isinstance(c, CacheList):
        return sum(held_bytes(part) for part in c.caches)
    if isinstance(c, ArraysCache):
        return sum(a.nbytes for a in c.cache if a is not None)
    keys, values = (c.keys, c.values) if isinstance(c, QuantizedKVCache) else ([c.keys], [c.values])
    n = min(c.offset, keys[0].shape[2])
    return sum(a[..., :n, :].nbytes for a in (*keys, *values))


def real_bytes(model, tokens: int) -> int:
    """What mlx-lm's own caches hold after a prompt of `tokens`, run as mlx_lm.generate runs
    one (all but the last token prefilled, the last one decoded)."""
    caches = make_prompt_cache(model)
    ids = mx.array([[10 + i % 1000 for i in range(tokens)]])
    model(ids[:, :-1], cache=caches)
    model(ids[:, -1:], cache=caches)
    mx.eval([c.state for c in caches])
    return sum(held_bytes(c) for c in caches)


def near(got: int, want: int) -> bool:
    return abs(got - want) <= TOLERANCE * want


@pytest.fixture(scope="module", params=[*sorted(FAMILIES), "llama"])
def family(request, tmp_path_factory):
    dest = tmp_path_factory.mktemp(request.param)
    if request.param == "llama":
        build_tiny_model(dest, arch="llama")
    else:
        build_family_model(dest, request.param)
    return request.param, dest, load_model(dest, request.param)


def test_the_measured_and_the_config_kv_cost_match_what_the_caches_hold(family):
    name, folder, loaded = family
    real = real_bytes(loaded.model, PROMPT)
    measured = loaded.kv_cost
    assert measured is not None
    assert near(measured.row_bytes(PROMPT), real), (name, measured, real)
    config = json.loads((folder / "config.json").read_text())
    planned = kv_cost_of_config(config, dtype_bytes_of(config))
    assert planned is not None
    assert near(planned.row_bytes(PROMPT), real), (name, planned, real)


def test_sliding_window_and_recurrent_layers_are_counted_as_such(family):
    name, _, loaded = family
    cost = loaded.kv_cost
    assert cost is not None
    windowed = FAMILIES.get(name, {}).get("sliding_window")
    assert (cost.window, bool(cost.windowed_per_token)) == (
        (WINDOW, True) if windowed else (0, False)
    )
    hybrid = name in RECURRENT
    assert bool(cost.per_row) == hybrid
    # A window's tokens stop costing once it is full; a state never grows with tokens.
    grown = cost.row_bytes(2 * PROMPT) - cost.row_bytes(PROMPT)
    assert grown == PROMPT * cost.per_token
    assert kv_cost_report(cost)["kv_window"] == cost.window  # as /stats reports it


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_kv_is_measured_at_its_packed_size(tmp_path, bits):
    folder = build_tiny_model(tmp_path, arch="llama")
    loaded = load_model(folder, "tiny", kv_bits=bits)
    real = real_bytes(loaded.model, PROMPT)
    assert loaded.kv_cost is not None and near(loaded.kv_cost.row_bytes(PROMPT), real)
    config = json.loads((folder / "config.json").read_text())
    planned = kv_cost_of_config(config, dtype_bytes_of(config), bits)
    assert planned == loaded.kv_cost


def test_a_sliding_window_models_long_row_fits_where_full_attention_would_not(tmp_path):
    loaded = load_model(build_family_model(tmp_path, "gemma3"), "gemma3")
    cost = loaded.kv_cost
    assert cost is not None and cost.window == WINDOW
    # Counted as if every layer attended to the whole row, 4096 tokens would not fit.
    every_layer = KvCost(cost.per_token + cost.windowed_per_token)
    budget = KvBudget.of(cost, cost.footprint(1, 4096), max_rows=4)
    assert budget is not None
    budget.check_alone(4000, 96)  # no 413
    assert every_layer.footprint(1, 4096) > budget.budget_bytes
    assert budget.output_room(4000) >= 96


def test_a_model_whose_caches_cannot_be_measured_is_planned_from_its_config(tiny_model_dir, caplog):
    config = json.loads((tiny_model_dir / "config.json").read_text())

    class Opaque:  # a cache kind of a future mlx-lm, and a forward that cannot run on it
        def make_cache(self):
            return [object()]

        def __call__(self, *args, **kwargs):
            raise TypeError("unknown cache")

    assert row_cost(Opaque(), config, 4, None, 64) == kv_cost_of_config(config, 4)
    assert "cannot measure" in caplog.text
