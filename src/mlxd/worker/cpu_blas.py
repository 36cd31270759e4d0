"""An optimised BLAS under MLX's CPU backend on Linux, when the machine has one.

MLX's Linux CPU wheel (`mlx[cpu]`) links the reference BLAS (netlib's `libblas`, bundled in
`mlx_cpu.libs`), whose `cblas_sgemm` is a plain loop nest: a (8 x 256) x (256 x 768) float32
product took 1.45 ms on this project's 2-core x86 machine, OpenBLAS's 0.135 ms on one thread,
and a decode step's matrix products grow with the batch (8 rows of a tiny llama decoded 5.5x
faster). A CPU worker computes unquantized layers in float32 (model/load.py upcasts float16
and bfloat16 weights), so their products all go through that call; quantized layers use
MLX's own kernels and gain nothing.

The price: the reference BLAS gives a row the same bits whatever the product's other rows,
OpenBLAS does not (its kernels differ by shape), so a row's logits can differ in the last bits
(~5e-6 on the tiny llama) between a batch and alone, or a prefill and a decode step. Near-tie
tokens could flip where the bundled BLAS was exact; the greedy-identity tests pass on
OpenBLAS's Zen, Haswell and Sandybridge kernels, and MLXD_CPU_BLAS=off restores exactness.

MLX's library finds `cblas_sgemm` when Python imports it, and the dynamic linker looks in the
global scope (the program and what was loaded with RTLD_GLOBAL) before that library's own
dependencies. So loading OpenBLAS with RTLD_GLOBAL before `mlx.core` is imported binds MLX to
it, with no rebuild and no LD_PRELOAD. Apple silicon never needs this (MLX runs on Metal and
uses Accelerate); a CUDA build only uses the CPU for small host-side work, unharmed.

One thread, always: OpenBLAS's fork handler stops its thread pool, and a worker forks (grammar
compiles, ffmpeg) while its engine thread can be inside `cblas_sgemm`, which then waits for
threads that are gone, forever (seen with Debian's OpenBLAS 0.3.21 under the fuzz test). One
thread never builds a pool. MLX's CPU backend runs a stream's work on one thread anyway.

`MLXD_CPU_BLAS`: `auto` (the default: OpenBLAS where the loader finds it), `off`, or a library
name or path to load instead (one exporting `cblas_sgemm`).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import MutableMapping

CANDIDATES = ("libopenblas.so.0", "libopenblas.so")
THREAD_VARIABLES = (
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
)
LOADED: list[str] = []  # what this process loaded (the worker's start-up line names it)


def load_cpu_blas(environ: MutableMapping[str, str], platform: str = sys.platform) -> str | None:
    """Load a BLAS for MLX's CPU backend before MLX is imported; the name loaded, or None
    (off, not Linux, none found, or MLX already imported: too late to bind it)."""
    choice = _choice(environ)
    if choice == "off" or not platform.startswith("linux") or "mlx.core" in sys.modules:
        return None
    before = {var: environ.get(var) for var in THREAD_VARIABLES}
    environ.update(dict.fromkeys(THREAD_VARIABLES, "1"))  # read by the library as it loads
    for name in CANDIDATES if choice == "auto" else (choice,):
        try:  # looked at privately first: a library that is no BLAS interposes nothing
            lib = ctypes.CDLL(name, mode=os.RTLD_LOCAL)
        except OSError:
            continue
        if hasattr(lib, "cblas_sgemm"):
            ctypes.CDLL(name, mode=os.RTLD_GLOBAL)  # the same library, now seen by MLX
            LOADED.append(name)
            return name
    for var, value in before.items():  # nothing loaded: the environment as it was
        if value is None:
            environ.pop(var, None)
        else:
            environ[var] = value
    return None


def startup_line(
    environ: MutableMapping[str, str], on_cpu: bool, platform: str = sys.platform
) -> str | None:
    """What the worker's log says of its matrix products, or None where there is nothing to
    say (not Linux, or a GPU worker: its products are on the device)."""
    if LOADED:
        return f"CPU matrix products through {LOADED[0]}, one thread"
    if not on_cpu or not platform.startswith("linux"):
        return None
    choice = _choice(environ)
    if choice == "off":
        return "CPU matrix products through MLX's bundled reference BLAS (MLXD_CPU_BLAS=off)"
    if choice != "auto":
        return (
            f"CPU matrix products through MLX's bundled reference BLAS: MLXD_CPU_BLAS={choice} "
            "did not load or has no cblas_sgemm"
        )
    return (
        "CPU matrix products through MLX's bundled reference BLAS: for unquantized models "
        "several times slower than OpenBLAS; install it (Debian and Ubuntu: apt-get install "
        "libopenblas0) and restart (docs/operations.md, 'Matrix products on Linux CPUs')"
    )


def _choice(environ: MutableMapping[str, str]) -> str:
    """MLXD_CPU_BLAS as set: `auto` where unset or empty."""
    return environ.get("MLXD_CPU_BLAS", "auto").strip() or "auto"
