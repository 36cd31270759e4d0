"""Worker-group specs from a config.toml, as the supervisor builds them (unit and e2e tests)."""

from __future__ import annotations

from pathlib import Path

from mlxd.shared.config_load import load_settings
from mlxd.shared.worker_spec import WorkerSpec
from mlxd.supervisor.catalog.discovery import ModelEntry
from mlxd.supervisor.lifecycle.launch import worker_spec
from mlxd.supervisor.lifecycle.slot import ModelSlot


def settings_with(tmp_path: Path, toml: str):
    """The settings of a home whose config.toml holds `toml`."""
    (tmp_path / "config.toml").write_text(toml)
    return load_settings({"home": str(tmp_path)})


def spec_of(tmp_path: Path, toml: str, model: str = "g") -> WorkerSpec:
    """Rank 0's WorkerSpec for `model` under that config."""
    s = settings_with(tmp_path, toml)
    slot = ModelSlot(
        entry=ModelEntry(model, Path("/models") / model, "config", 100),
        settings=s.for_model(model),
        socket=s.run_dir / f"{model}.sock",
        estimate_bytes=100,
    )
    return worker_spec(s, slot, memory_limit_bytes=8000)
