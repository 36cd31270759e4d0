"""The pure parts of the multi-adapter bench (bench/adapters.py): which adapter each row
names, the config that mounts them, and the arithmetic of its report. No server, no MLX."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `bench/` sits beside `src/`, outside the installed package
    sys.path.insert(0, str(ROOT))

from bench.adapters import AdapterSizes, add_run, config_toml, figures, level_stats, rows  # noqa: E402
from bench.client import StreamResult, Target  # noqa: E402
from bench.report import summarize  # noqa: E402


def _res(ttft: float, tokens: int = 128) -> StreamResult:
    return StreamResult(ttft, ttft + 2.0, tokens, 300, "x", True, 0)


def test_level_stats_sum_every_rows_tokens_over_the_wall():
    stats = level_stats([_res(0.1), _res(0.3), _res(0.2), _res(0.4, tokens=64)], wall=4.0)
    assert stats["agg"] == pytest.approx((3 * 128 + 64) / 4.0)
    assert stats["ttft50"] == pytest.approx(0.25)
    assert stats["ttft95"] == pytest.approx(0.385)
    assert stats["wall"] == 4.0


def test_rows_go_round_robin_over_the_adapters_and_mlx_lm_names_the_folder():
    ctx = SimpleNamespace(
        mlxd=Target("mlxd", "mlxd", "http://x", model="bench-a"),
        mlx_lm=Target("mlx_lm", "mlx_lm.server", "http://y"),
        model_a=Path("/m"),
    )
    folders = [Path(f"/ad/a{i}") for i in range(4)]
    assert [t.model for t in rows(ctx, "mlxd", 4, folders, 6)] == [
        "bench-a:a0", "bench-a:a1", "bench-a:a2", "bench-a:a3", "bench-a:a0", "bench-a:a1",
    ]  # fmt: skip
    assert {t.model for t in rows(ctx, "mlxd", 0, folders, 3)} == {"bench-a"}
    ref = rows(ctx, "mlx_lm", 1, folders, 2)
    assert [(t.model, t.extra_body) for t in ref] == [("/m", {"adapters": "/ad/a0"})] * 2
    assert rows(ctx, "mlx_lm", 0, folders, 1)[0].model is None  # its default model


def test_config_mounts_every_adapter_on_the_bench_model():
    text = config_toml([Path("/ad/a0"), Path('/ad/we"ird')])
    assert tomllib.loads(text) == {
        "models": {"bench-a": {"adapters": {"a0": "/ad/a0", "a1": '/ad/we"ird'}}}
    }
    assert config_toml([]) == ""


def test_ratio_to_base_is_the_median_of_each_runs_pair_and_the_goal_is_at_16():
    sz = AdapterSizes(levels=(1, 16), mlx_lm_levels=(0, 1))
    figs = figures(sz)
    assert set(figs) == {("base", 1), ("base", 16), ("mlx_lm", 0), ("mlx_lm", 1)}
    for base, at16 in ((100.0, 90.0), (200.0, 150.0), (120.0, 108.0)):
        stats = lambda agg: {"agg": agg, "ttft50": 1.0, "ttft95": 2.0, "wall": 3.0}  # noqa: E731
        measured = {("mlxd", 0): stats(base), ("mlxd", 16): stats(at16)}
        measured[("mlx_lm", 0)] = stats(base / 2)  # mlx_lm at 1 and mlxd at 1 failed: no pair
        add_run(figs, measured)
    row = summarize(figs[("base", 16)]["agg"])
    assert row["ratio"] == pytest.approx(0.9)  # pairs 0.9, 0.75, 0.9: not 108 / 120
    assert row["goal"] == 0.8 and row["goal_met"] is True
    assert row["spread"] == pytest.approx((0.9 - 0.75) / 2 / 0.9)
    assert summarize(figs[("base", 1)]["agg"])["ratio"] is None
    assert figs[("base", 1)]["agg"].goal is None
    vs_mlx_lm = summarize(figs[("mlx_lm", 0)]["agg"])
    assert vs_mlx_lm["ratio"] == pytest.approx(2.0) and vs_mlx_lm["base"] == "mlx_lm"
