"""Where mx.distributed finds a rank's peers: the environment mlx.launch would set (no MLX)."""

from __future__ import annotations

import json
import os
import tempfile

from mlxd.shared.worker_spec import GroupSpec


def group_env(spec: GroupSpec, hostfile: str | None = None) -> dict[str, str]:
    """The variables the backend reads at init (the entry point sets them: it is the one
    place a worker touches its environment); `hostfile`: the ring's, write_hostfile's."""
    env = {"MLX_RANK": str(spec.rank), "MLX_WORLD_SIZE": str(spec.size)}
    if spec.backend == "ring" and hostfile is not None:
        env["MLX_HOSTFILE"] = hostfile
    if spec.backend == "nccl" and spec.coordinator:
        host, _, port = spec.coordinator.rpartition(":")
        env.update(NCCL_HOST_IP=host, NCCL_PORT=port)
    return env


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
