"""On Linux a CPU worker's matrix products go through OpenBLAS when the machine has it
(mlxd/worker/cpu_blas.py): the dynamic linker's own record (LD_DEBUG=bindings) shows MLX's
`cblas_sgemm` bound to it in a real worker, and to MLX's bundled reference BLAS with
MLXD_CPU_BLAS=off."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from procs import start_worker, stop, uds_openai

try:
    ctypes.CDLL("libopenblas.so.0")
    HAVE_OPENBLAS = True
except OSError:
    HAVE_OPENBLAS = False

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux matter")


def sgemm_bindings(folder) -> list[str]:
    """The loader's lines binding MLX's library's cblas_sgemm, from every process's file."""
    return [
        line
        for f in folder.glob("bind.*")
        for line in f.read_text(errors="replace").splitlines()
        if "libmlx.so" in line.split(" to ")[0] and "`cblas_sgemm'" in line
    ]


@pytest.mark.skipif(not HAVE_OPENBLAS, reason="no OpenBLAS here (apt install libopenblas0)")
def test_a_worker_multiplies_through_openblas(tiny_model_dir, short_tmp, monkeypatch):
    folder = short_tmp / "ld"
    folder.mkdir()
    monkeypatch.delenv("MLXD_CPU_BLAS", raising=False)
    monkeypatch.setenv("LD_DEBUG", "bindings")
    monkeypatch.setenv("LD_DEBUG_OUTPUT", str(folder / "bind"))
    sock, log = short_tmp / "blas.sock", short_tmp / "blas.log"
    proc = start_worker(tiny_model_dir, sock, "tiny", "--no-ssd-cache", log=log)
    try:
        r = uds_openai(sock).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert r.usage.completion_tokens == 4
    finally:
        assert stop(proc) == 0
    lines = sgemm_bindings(folder)
    assert lines and all("libopenblas.so.0" in line.split(" to ")[1] for line in lines)
    assert "CPU matrix products through libopenblas.so.0, one thread" in log.read_text()


def test_off_keeps_mlxs_own_blas(short_tmp):
    folder = short_tmp / "ld-off"
    folder.mkdir()
    code = (
        "import os; from mlxd.worker.cpu_blas import load_cpu_blas\n"
        "assert load_cpu_blas(os.environ) is None\n"
        "import mlx.core as mx; a = mx.ones((4, 8)); mx.eval(a @ a.T)\n"
    )
    env = {"MLXD_CPU_BLAS": "off", "LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": str(folder / "bind")}
    base = {k: v for k, v in os.environ.items() if not k.startswith("LD_DEBUG")}
    subprocess.run([sys.executable, "-c", code], check=True, env={**base, **env})
    lines = sgemm_bindings(folder)
    assert lines and not any("openblas" in line.split(" to ")[1] for line in lines)
