"""How a request's `model` names a LoRA adapter (Catalog.route) and how config sections
declare them: no MLX, no processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxd.shared.config import ConfigError
from mlxd.shared.config_load import load_settings
from mlxd.shared.errors import ModelNotFound
from mlxd.supervisor.catalog.catalog import Catalog


def _home(tmp_path: Path, config: str) -> dict:
    for name in ("qwen", "llama3:8b"):
        folder = tmp_path / "models" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    (tmp_path / "config.toml").write_text(config)
    return {"home": str(tmp_path), "discover_hf_cache": False}


def test_each_way_to_name_an_adapter_reaches_the_base_models_worker(tmp_path):
    s = load_settings(
        _home(
            tmp_path,
            '[models.sql]\nbase = "qwen"\nadapter_path = "/a/sql"\n'
            '[models.qwen]\nadapters = { chat = "/a/chat" }\n',
        )
    )
    cat = Catalog(s)

    def route(model: str, adapter: str | None = None) -> tuple[str, str | None]:
        entry, named = cat.route(model, adapter)
        return entry.id, named

    assert route("qwen") == ("qwen", None)
    assert route("sql") == ("qwen", "sql")  # a configured id: base + adapter_path
    assert route("qwen:chat") == ("qwen", "chat")
    assert route("qwen", adapter="chat") == ("qwen", "chat")
    assert route("llama3:8b") == ("llama3:8b", None)  # an id with a colon stays a model
    with pytest.raises(ModelNotFound):
        route("nothing:chat")
    # Ollama's name of a model (what /api/tags lists) on every surface: a probe (2026-12-07)
    # found "qwen:latest" a 404 on /v1 and /v1/messages
    assert route("qwen:latest") == ("qwen", None)
    assert route("llama3:8b:latest") == ("llama3:8b", None)
    with pytest.raises(ModelNotFound):
        route("nothing:latest")
    assert s.for_model("qwen").adapters == {"chat": Path("/a/chat"), "sql": Path("/a/sql")}


@pytest.mark.parametrize(
    "config, why",
    [
        ('[models.sql]\nbase = "qwen"\n', "go together"),
        ('[models.qwen]\nadapters = { "a b" = "/x" }\n', "adapter name"),
        ('[models.qwen]\nadapters = { latest = "/x" }\n', "not 'latest'"),
    ],
)
def test_adapter_sections_that_cannot_work_are_config_errors(tmp_path, config, why):
    with pytest.raises(ConfigError, match=why):
        load_settings(_home(tmp_path, config))
