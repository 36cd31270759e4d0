"""The memory the supervisor plans its workers in: RAM, and a CUDA card's own memory.

On a Mac the GPU shares RAM (unified memory), and on MLX's CPU backend arrays live in RAM.
With MLX's CUDA backend a worker's weights, KV and prompt cache live on the card, which
is usually smaller than the host's RAM (an 80 GB H100 in a 126 GiB host): a budget of 75% of
RAM let the supervisor load more models than the card holds, and each extra load then died
of a CUDA allocation error. The supervisor never imports MLX (a CUDA context costs memory on
the card and seconds at start), so it reads the card's size from `nvidia-smi`, and only where
MLX's CUDA backend is installed (the `mlx-cuda-12` / `mlx-cuda-13` distributions).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import subprocess
from collections.abc import Callable

import psutil

log = logging.getLogger("mlxd.daemon")

CUDA_DISTRIBUTIONS = ("mlx-cuda-13", "mlx-cuda-12", "mlx-cuda")
QUERY = ["--query-gpu=memory.total", "--format=csv,noheader,nounits"]  # MiB, one line a card


def mlx_on_cuda() -> bool:
    """Whether MLX's CUDA backend is installed here."""
    for name in CUDA_DISTRIBUTIONS:
        try:
            importlib.metadata.distribution(name)
            return True
        except importlib.metadata.PackageNotFoundError:
            continue
    return False


def _nvidia_smi(args: list[str]) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise FileNotFoundError("nvidia-smi")
    done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=20, check=True)
    return done.stdout


def card_bytes(
    query: Callable[[list[str]], str] = _nvidia_smi, visible: str | None = None
) -> int | None:
    """Memory of the card MLX runs on (the first of CUDA_VISIBLE_DEVICES, else card 0), from
    `nvidia-smi`'s answer; None when it cannot be read."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    first = (visible or "0").split(",")[0].strip()
    try:
        lines = [x.strip() for x in query(QUERY).splitlines() if x.strip()]
        index = int(first) if first.isdigit() else 0  # a UUID: the first card listed
        return int(float(lines[index])) * 1024**2
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        log.warning("could not read the CUDA card's memory (%s); planning in RAM", exc)
        return None


def cuda_card_bytes(on_cuda: Callable[[], bool] = mlx_on_cuda) -> int | None:
    """The card's memory where MLX runs on CUDA; None elsewhere (a Mac, the CPU)."""
    return card_bytes() if on_cuda() else None


def ram_bytes() -> int:
    return psutil.virtual_memory().total
