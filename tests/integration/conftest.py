"""A real worker process on the tiny model, shared by the worker's integration tests."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

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
