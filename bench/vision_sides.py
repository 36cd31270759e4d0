"""The two sides of `python -m bench vision`: mlx-vlm's generator in a process of its own
(bench/vision_baseline.py) driven job by job, and mlxd started as a user starts it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from .client import BenchError, Target
from .models import alias_model
from .servers import (
    StartError,
    _die_with_parent,
    start_supervisor,
    start_worker,
    supervisor_available,
)
from .session import SUPERVISOR_ENV
from .vision_setup import ROOT

MODEL = "bench-vlm"


class Baseline:
    """mlx-vlm's generator in its own process (bench/vision_baseline.py), job by job."""

    def __init__(self, model: Path, log: Path):
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as err:  # the child holds its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench.vision_baseline", str(model)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=ROOT,
                text=True,
                env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"},
                preexec_fn=_die_with_parent,  # no orphan holding the GPU if the bench is killed
            )
        self.log = log

    async def _line(self) -> dict:
        line = await asyncio.to_thread(self.proc.stdout.readline)
        if not line:
            tail = self.log.read_text(errors="replace").splitlines()[-2:]
            raise BenchError("mlx-vlm baseline exited:\n" + "\n".join(tail))
        answer = json.loads(line)
        if "error" in answer:
            raise BenchError(f"mlx-vlm baseline: {answer['error']}")
        return answer

    async def ready(self) -> None:
        await self._line()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    async def job(self, **job) -> dict:
        try:
            self.proc.stdin.write(json.dumps(job, default=str) + "\n")
            self.proc.stdin.flush()
        except OSError as exc:  # it exited: its log says why
            raise BenchError(f"mlx-vlm baseline gone ({exc}); see {self.log}") from exc
        return await self._line()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def start_mlxd(model: Path, work: Path, logs: Path) -> tuple[list, Target, str]:
    """`mlxd start` serving the model (else one worker on its socket); its target, and how."""
    ok, why = supervisor_available()
    if ok:
        home = work / "home"
        alias_model(model, home / "models" / MODEL)
        try:
            sup = await start_supervisor(home, MODEL, logs, SUPERVISOR_ENV)
            return [sup], sup.target, "supervisor over TCP (`mlxd start`)"
        except StartError as exc:
            why = str(exc).splitlines()[0][:200]
    w = await start_worker(model, MODEL, work / "w.sock", logs)
    target = dataclasses.replace(w.target, name="mlxd", label="mlxd worker (UNIX socket)")
    return [w], target, f"worker UNIX socket directly: supervisor unavailable ({why})"


def accelerated() -> bool:
    """Whether MLX's default device here is a GPU (asked in a child: no MLX here)."""
    code = "import mlx.core as mx; print(mx.default_device().type == mx.DeviceType.gpu)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return r.stdout.strip() == "True"
