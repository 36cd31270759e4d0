"""Lifecycle transitions, layered settings and model discovery: no MLX, no processes."""

import json
from pathlib import Path

import pytest

from mlxd.shared.config_load import load_settings
from mlxd.supervisor.catalog.discovery import discover
from mlxd.supervisor.lifecycle.states import TRANSITIONS, State, is_valid_transition


def test_every_state_has_a_way_forward_and_fatal_needs_a_reload():
    assert set(TRANSITIONS) == set(State)
    assert is_valid_transition(State.STOPPED, State.STARTING)
    assert is_valid_transition(State.STARTING, State.READY)
    assert not is_valid_transition(State.STOPPED, State.READY)  # READY only after STARTING
    assert not is_valid_transition(State.FATAL, State.STARTING)
    assert TRANSITIONS[State.FATAL] == {State.STOPPED}


def test_flags_over_environment_over_toml(tmp_path, monkeypatch):
    (tmp_path / "config.toml").write_text(
        'port = 9000\nkeep_alive_s = 5\nbatch = 4\n[models."org/m"]\npinned = true\nbatch = 2\n'
    )
    monkeypatch.setenv("MLXD_KEEP_ALIVE_S", "7")
    monkeypatch.setenv("MLXD_BATCH", "6")
    s = load_settings({"home": str(tmp_path), "port": 1234})
    assert (s.port, s.keep_alive_s, s.batch) == (1234, 7.0, 6)
    assert s.for_model("org/m").pinned and s.for_model("org/m").batch == 2
    assert not s.for_model("other").pinned


def test_explicit_config_file_and_bad_values(tmp_path):
    cfg = tmp_path / "x.toml"
    cfg.write_text("max_loaded_models = -3\n")
    with pytest.raises(ValueError):
        load_settings({"home": str(tmp_path)}, cfg)


def _model(path, weights=100):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "model.safetensors").write_bytes(b"\0" * weights)


def test_discovery_of_home_hf_cache_and_config(tmp_path):
    home = tmp_path / "home"
    _model(home / "models" / "plain")
    _model(home / "models" / "org" / "nested")
    (home / "models" / ".partial").mkdir(parents=True)  # an import in progress
    hf = tmp_path / "hub"
    snap = hf / "models--mlx-community--Foo-4bit" / "snapshots" / "abc123"
    _model(snap, weights=300)
    (hf / "models--mlx-community--Foo-4bit" / "refs").mkdir()
    (hf / "models--mlx-community--Foo-4bit" / "refs" / "main").write_text("abc123")
    _model(tmp_path / "elsewhere")
    (home / "config.toml").write_text(f'[models.custom]\npath = "{tmp_path / "elsewhere"}"\n')
    s = load_settings({"home": str(home)})
    found = discover(s, hf_cache=hf)
    assert set(found) == {"plain", "org/nested", "mlx-community/Foo-4bit", "custom"}
    assert found["mlx-community/Foo-4bit"].path == snap
    assert found["mlx-community/Foo-4bit"].weights_bytes == 300
    assert found["custom"].source == "config"


def test_hf_cache_location_is_a_resolved_setting(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HOME", raising=False)
    home = {"home": str(tmp_path)}
    assert load_settings(home).hf_cache_dir == Path("~/.cache/huggingface/hub").expanduser()
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    assert load_settings(home).hf_cache_dir == tmp_path / "hf-home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert load_settings(home).hf_cache_dir == tmp_path / "hub"
    # Discovery scans the setting (here given as a flag, which wins over the hub's variables).
    _model(tmp_path / "mine" / "models--org--x" / "snapshots" / "r1")
    s = load_settings({**home, "hf_cache_dir": str(tmp_path / "mine")})
    assert s.hf_cache_dir == tmp_path / "mine"
    assert set(discover(s)) == {"org/x"}
    assert discover(s.model_copy(update={"discover_hf_cache": False})) == {}
