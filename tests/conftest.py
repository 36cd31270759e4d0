"""Shared pytest fixtures.

Model fixtures are session-scoped: each tiny model is built once per run (it is deterministic,
so sharing it between tests cannot leak state through the files).
"""

from __future__ import annotations

import os
import pathlib

import pytest

from mlxd.worker.cpu_blas import load_cpu_blas

# The references computed here (mlx-lm's own generation) use the BLAS the workers use: before
# anything imports mlx.core.
load_cpu_blas(os.environ)

from tiny_model import build_tiny_embedding_model, build_tiny_model  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test` stays under ten minutes on two cores: tests marked `slow` run under
    `make test-slow` (MLXD_TEST_SLOW=1), which CI runs too."""
    if os.environ.get("MLXD_TEST_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="the long tier: `make test-slow` (MLXD_TEST_SLOW=1)")
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A tiny llama model folder (seed 0) that mlx_lm.load opens offline."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), arch="llama", seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir_b(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A second, different tiny model (qwen3, seed 1) for multi-model tests."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"), arch="qwen3", seed=1)


@pytest.fixture(scope="session")
def tiny_embedding_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A tiny Qwen3-Embedding-style folder (sentence-transformers files, flat keys, no head)."""
    return build_tiny_embedding_model(tmp_path_factory.mktemp("tiny-embed"), seed=2)
