"""GET /admin/fit and `mlxctl fit`: what fits per KV scheme, against the worker's own plan."""

from __future__ import annotations

import json

import psutil
import pytest
from families import WINDOW, build_family_model

from mlxd.shared.kv_config import kv_cost_of_config
from mlxd.shared.kv_math import max_context, max_rows
from mlxd.shared.memory_plan import plan_memory
from mlxd.supervisor.ctl.mlxctl import main as mlxctl

from procs import uds_client

BUDGET = 2 * 1024**3
CACHE = 64 * 1024**2
CONTEXT = 2048
CONFIG = f"""
memory_budget_bytes = {BUDGET}
prompt_cache_bytes = {CACHE}
context_limit = {CONTEXT}
[models."a"]
kv_bits = 8
"""
# The tiny model: 4 layers x 2 KV heads x (K, V), head dim 64, computed in float32.
BYTES_PER_TOKEN = {16: 16 * 64 * 4, 8: 16 * (64 + 2 * 4), 4: 16 * (32 + 2 * 4)}


@pytest.fixture(scope="module")
def daemon(make_module_daemon, tiny_model_dir, tiny_model_dir_b, tmp_path_factory):
    gemma3 = build_family_model(tmp_path_factory.mktemp("gemma3"), "gemma3")
    models = {"a": tiny_model_dir, "b": tiny_model_dir_b, "g": gemma3}
    return make_module_daemon(models=models, config=CONFIG)


def fit(d, model: str):
    return d.http.get("/admin/fit", params={"model": model})


def loaded_fit(d, model: str) -> tuple[dict, dict]:
    """The fit report of `model` once a request loaded it, and its worker's /stats."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert d.http.post("/v1/chat/completions", json=body).is_success
    report = fit(d, model).json()
    with uds_client(d.home / "run" / f"{model}.sock", 10) as c:
        return report, c.get("/stats").json()


def test_fit_of_an_unloaded_model_follows_the_memory_plan(daemon):
    r = fit(daemon, "b")
    assert r.status_code == 200
    body = r.json()
    weights = next(m for m in daemon.http.get("/admin/models").json()["data"] if m["id"] == "b")
    plan = plan_memory(
        machine_bytes=psutil.virtual_memory().total,
        share_bytes=BUDGET,
        weights_bytes=weights["weights_bytes"],
        prompt_cache_bytes=CACHE,
    )
    assert body["loaded"] is None and body["kv_bits"] == 16
    assert body["kv_budget_bytes"] == plan.kv_budget_bytes > 0
    assert body["context_length"] == CONTEXT
    schemes = {s["kv_bits"]: s for s in body["schemes"]}
    assert {b: s["bytes_per_token"] for b, s in schemes.items()} == BYTES_PER_TOKEN
    for bits, s in schemes.items():
        bpt = BYTES_PER_TOKEN[bits]
        assert s["max_context_at_batch_1"] == min(CONTEXT, max_context(plan.kv_budget_bytes, bpt))
        assert s["max_batch_at_context"] == max_rows(plan.kv_budget_bytes, bpt, CONTEXT)
    # Fewer bits per token: more rows of the whole context fit.
    assert schemes[4]["max_batch_at_context"] > schemes[8]["max_batch_at_context"]
    assert schemes[8]["max_batch_at_context"] > schemes[16]["max_batch_at_context"]


def test_fit_of_a_loaded_quantized_model_matches_its_worker(daemon):
    report, stats = loaded_fit(daemon, "a")
    loaded = report["loaded"]
    assert report["kv_bits"] == 8 and loaded["state"] == "ready" and loaded["kv_bits"] == 8
    eight = next(s for s in report["schemes"] if s["kv_bits"] == 8)
    assert eight["bytes_per_token"] == stats["kv_bytes_per_token"] == loaded["kv_bytes_per_token"]
    assert eight["measured"] and not any(s["measured"] for s in report["schemes"] if s != eight)
    assert loaded["kv_budget_bytes"] == stats["kv_budget_bytes"]
    # The worker planned from its weights in memory, the report from the files: within 1%.
    assert (
        abs(report["kv_budget_bytes"] - stats["kv_budget_bytes"]) <= report["kv_budget_bytes"] / 100
    )
    assert loaded["reported"] and loaded["footprint_bytes"] > 0


def test_mlxctl_fit_prints_the_report(daemon, capsys):
    argv = ["--url", daemon.url, "--home", str(daemon.home), "fit", "b"]
    assert mlxctl([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == fit(daemon, "b").json()
    assert mlxctl(argv) == 0
    text = capsys.readouterr().out
    assert "CONTEXT AT BATCH 1" in text and "8-bit" in text and "float *" in text
    assert "not loaded" in text


def test_unknown_model_is_a_404_and_no_model_a_400(daemon, capsys):
    r = fit(daemon, "nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert daemon.http.get("/admin/fit").status_code == 400
    assert mlxctl(["--url", daemon.url, "--home", str(daemon.home), "fit", "nope"]) == 1
    assert "nope" in capsys.readouterr().err


def test_fit_of_a_sliding_window_model_counts_its_windows_not_the_context(daemon, capsys):
    report = fit(daemon, "g").json()
    config = json.loads((daemon.home / "models" / "g" / "config.json").read_text())
    cost = kv_cost_of_config(config, report["kv_dtype_bytes"])
    assert cost is not None and cost.window == WINDOW
    (scheme,) = report["schemes"]  # rotating windows take no kv_bits: float only
    assert (scheme["window"], scheme["windowed_bytes_per_token"]) == (
        WINDOW,
        cost.windowed_per_token,
    )
    assert scheme["bytes_per_token"] == cost.per_token
    assert scheme["bytes_at_context"] == cost.row_bytes(CONTEXT)
    assert (report["attention_layers"], report["window_layers"]) == (2, 2)
    assert mlxctl(["--url", daemon.url, "--home", str(daemon.home), "fit", "g"]) == 0
    text = capsys.readouterr().out
    assert "2 sliding-window" in text and f"(up to {WINDOW})" in text


def test_a_loaded_sliding_window_models_report_is_its_workers_measured_cost(daemon):
    report, stats = loaded_fit(daemon, "g")
    (scheme,) = report["schemes"]
    assert scheme["measured"] and stats["kv_window"] == scheme["window"] == WINDOW
    assert stats["kv_windowed_bytes_per_token"] == scheme["windowed_bytes_per_token"] > 0
    assert report["loaded"]["kv_window"] == WINDOW
