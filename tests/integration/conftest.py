"""A real worker process on the tiny model, shared by the worker's integration tests."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from tiny_vlm import FAMILIES, build_vlm

from procs import CONTEXT_LIMIT, MAX_BODY_BYTES, start_worker, stop, uds_client, uds_openai


@pytest.fixture(scope="session")
def short_tmp():
    # UNIX socket paths are limited to ~104 bytes: keep them short.
    d = Path(tempfile.mkdtemp(prefix="mlxd-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def worker(tiny_model_dir, short_tmp, request):
    sock = short_tmp / f"{request.module.__name__[-12:]}.sock"
    proc = start_worker(
        tiny_model_dir,
        sock,
        "tiny",
        "--context-limit",
        str(CONTEXT_LIMIT),
        "--max-body-bytes",
        str(MAX_BODY_BYTES),
        log=short_tmp / f"{sock.stem}.log",
    )
    yield sock
    stop(proc)


@pytest.fixture
def oai(worker):
    return uds_openai(worker)


@pytest.fixture
def http(worker):
    with uds_client(worker) as c:
        yield c


@pytest.fixture(scope="module", params=FAMILIES)
def vlm(request, tmp_path_factory):
    """A tiny VLM of each family (tests/tiny_vlm.py) loaded as the worker loads one: (family,
    folder, the mlx-lm text model, its vision parts)."""
    from mlxd.worker.model.load import load_model
    from mlxd.worker.vision.load import load_vision

    path = build_vlm(tmp_path_factory.mktemp(request.param), request.param)
    loaded = load_model(path, request.param)
    parts = load_vision(path, loaded.model, loaded.tokenizer)
    assert parts is not None
    return request.param, path, loaded, parts
