"""Settings MLX reads from the environment once per process, as mlxd serves with them.

MLX's CUDA backend records kernels into CUDA graphs and launches one every 30 kernels or
400 MB of inputs on an H100/H200 (its defaults). A decode step of an 8B model reads 16 GB of
weights: ~40 graphs a step, each updated and launched from the host, which is what a
host-bound step waits on. Graphs of 100 kernels with no byte limit measured faster on the
lent H200 (docs/benchmarks.md, 2026-12-02); much larger ones start the device too late in
the step (2,000 kernels halved 8B batch-1 decode). A value the user set is kept. Only on
Linux (CUDA; the CPU backend ignores them): MLX's Metal backend reads the same variables with
its own, much smaller defaults, and these were never measured there.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping

DEVICE_ENV = {"MLX_MAX_OPS_PER_BUFFER": "100", "MLX_MAX_MB_PER_BUFFER": "1000000"}


def apply_device_env(environ: MutableMapping[str, str], platform: str = sys.platform) -> None:
    """Fill in mlxd's defaults where `environ` leaves them unset (on Linux only)."""
    if not platform.startswith("linux"):
        return
    for name, value in DEVICE_ENV.items():
        environ.setdefault(name, value)
