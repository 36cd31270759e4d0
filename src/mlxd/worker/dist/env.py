"""Where mx.distributed finds a rank's peers: the environment mlx.launch would set (no MLX)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from mlxd.shared.worker_spec import GroupSpec


def group_env(
    spec: GroupSpec, hostfile: str | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The variables the backend reads at init (the entry point sets them, before MLX is
    imported: it is the one place a worker touches its environment); `hostfile`: the ring's,
    write_hostfile's; `environ`: the worker's own (the GPUs it was given).

    Raises ValueError when an NCCL rank's GPU is not there (CUDA_VISIBLE_DEVICES lists too
    few, or the driver shows too few).
    """
    env = {"MLX_RANK": str(spec.rank), "MLX_WORLD_SIZE": str(spec.size)}
    if spec.backend == "ring" and hostfile is not None:
        env["MLX_HOSTFILE"] = hostfile
    if spec.backend == "nccl" and spec.coordinator:
        host, _, port = spec.coordinator.rpartition(":")
        env.update(NCCL_HOST_IP=host, NCCL_PORT=port)
    if spec.backend == "nccl" and spec.device is not None:
        env["CUDA_VISIBLE_DEVICES"] = _gpu_of(spec, (environ or {}).get("CUDA_VISIBLE_DEVICES"))
    return env


def _gpu_of(spec: GroupSpec, visible: str | None) -> str:
    """The rank's GPU: its index on the host, or that entry of the GPUs the worker was given."""
    assert spec.device is not None
    if visible is None:  # all of the host's GPUs: its count, where the driver shows it
        count = host_gpu_count()
        if count is None or spec.device < count:
            return str(spec.device)
        said = f"this host has {count}"
    else:  # "" hides every GPU, as CUDA reads it
        given = [g.strip() for g in visible.split(",") if g.strip()]
        if spec.device < len(given):
            return given[spec.device]
        said = f"CUDA_VISIBLE_DEVICES lists {len(given)} ({visible!r})"
    raise ValueError(
        f"rank {spec.rank} of the group needs GPU #{spec.device + 1} of this host, "
        f"but {said}: NCCL needs one GPU per rank"
    )


NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU (Linux driver)


def host_gpu_count() -> int | None:
    """The host's NVIDIA GPUs, read from the driver without starting CUDA; None: unknown."""
    try:
        return sum(1 for _ in NVIDIA_GPUS.iterdir())
    except OSError:
        return None


_written: list[str] = []  # this process's hostfile, until the backend has read it


def write_hostfile(spec: GroupSpec) -> str | None:
    """The ring backend's hostfile (mlx.launch's format: one list of "ip:port" per rank), in
    a private temporary file of this rank's host; None for other backends."""
    if spec.backend != "ring" or not spec.peers:
        return None
    fd, path = tempfile.mkstemp(prefix="mlxd-ring-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump([[p] for p in spec.peers], f)
    _written.append(path)
    return path


def forget_hostfile() -> None:
    """Remove the hostfile once the group is joined, or when the worker ends before that (a
    rank killed while joining leaves it in the temporary folder)."""
    while _written:
        try:
            os.unlink(_written.pop())
        except FileNotFoundError:
            pass
