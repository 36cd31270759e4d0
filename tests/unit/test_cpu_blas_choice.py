"""Which BLAS a worker loads for MLX's CPU backend, and the environment it leaves (the load
itself, and MLX binding to it, are proven in tests/integration/test_cpu_blas.py)."""

from __future__ import annotations

from mlxd.worker import cpu_blas
from mlxd.worker.cpu_blas import load_cpu_blas, startup_line


def test_off_and_other_platforms_load_nothing_and_touch_nothing():
    for env, platform in (({"MLXD_CPU_BLAS": "off"}, "linux"), ({}, "darwin")):
        before = dict(env)
        assert load_cpu_blas(env, platform) is None
        assert env == before


def test_a_library_that_does_not_load_leaves_the_environment_as_it_was():
    env = {"MLXD_CPU_BLAS": "libno-such-blas-mlxd.so.9", "OMP_NUM_THREADS": "7"}
    assert load_cpu_blas(env, "linux") is None
    assert env == {"MLXD_CPU_BLAS": "libno-such-blas-mlxd.so.9", "OMP_NUM_THREADS": "7"}


def test_a_library_without_cblas_sgemm_is_not_taken():
    env = {"MLXD_CPU_BLAS": "libm.so.6"}  # loads, but is no BLAS
    assert load_cpu_blas(env, "linux") is None
    assert env == {"MLXD_CPU_BLAS": "libm.so.6"}


def test_the_start_up_line_names_the_blas_and_how_to_get_the_fast_one(monkeypatch):
    monkeypatch.setattr(cpu_blas, "LOADED", ["libopenblas.so.0"])
    assert (
        startup_line({}, on_cpu=True) == "CPU matrix products through libopenblas.so.0, one thread"
    )
    monkeypatch.setattr(cpu_blas, "LOADED", [])
    hint = startup_line({}, on_cpu=True, platform="linux")
    assert hint and "apt-get install libopenblas0" in hint and "operations.md" in hint
    off = startup_line({"MLXD_CPU_BLAS": "off"}, on_cpu=True, platform="linux")
    assert off and "MLXD_CPU_BLAS=off" in off and "apt-get" not in off
    bad = startup_line({"MLXD_CPU_BLAS": "libnope.so"}, on_cpu=True, platform="linux")
    assert bad and "MLXD_CPU_BLAS=libnope.so did not load" in bad
    assert startup_line({}, on_cpu=False, platform="linux") is None  # a GPU worker
    assert startup_line({}, on_cpu=True, platform="darwin") is None
