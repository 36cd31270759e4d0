"""A worker's entry point and process handling as real processes: its device limits, no MLX
before a rank's GPU is chosen, a rank that cannot start, a killed process seen as exited.
(Moved from tests/unit, which starts no process.)"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from group_specs import spec_of

from mlxd.supervisor.lifecycle.group import GroupProcess, rank_specs
from mlxd.supervisor.lifecycle.process import WorkerProcess
from mlxd.worker.device_env import DEVICE_ENV

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_a_started_worker_runs_with_the_limits(tmp_path):
    code = "import mlxd.worker.__main__, os; print(os.environ['MLX_MAX_OPS_PER_BUFFER'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == DEVICE_ENV["MLX_MAX_OPS_PER_BUFFER"]


def test_the_worker_entry_point_chooses_the_gpu_before_mlx_loads():
    # CUDA reads CUDA_VISIBLE_DEVICES once: nothing the entry point imports before it sets a
    # rank's GPU may load MLX.
    code = (
        "import sys, mlxd.worker.__main__\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mlx'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_rank_without_a_gpu_of_its_own_exits_saying_why(tmp_path):
    spec = spec_of(tmp_path, '[models.g]\ngroup_size = 2\nbackend = "nccl"\n')
    rank1 = rank_specs(spec, ["127.0.0.1"] * 2)[1]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "PYTHONPATH": SRC}
    done = subprocess.run(
        [sys.executable, "-m", "mlxd.worker", *rank1.to_argv()],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "rank 1 of the group needs GPU #2" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_rank_that_cannot_start_takes_the_started_ones_down(tmp_path, monkeypatch):
    """A rank whose launcher is missing (no ssh on this host): the ranks already running
    would wait for it forever in the ring backend's accept."""
    started: list[WorkerProcess] = []
    real_spawn = WorkerProcess.spawn

    async def spawn(self, env=None):
        if started:
            raise FileNotFoundError("ssh")
        self.command = ["sh", "-c", "exec sleep 30", "sh"]
        started.append(self)
        await real_spawn(self, env)

    monkeypatch.setattr(WorkerProcess, "spawn", spawn)

    async def run():
        g = GroupProcess("g", spec_of(tmp_path, "[models.g]\ngroup_size = 2\n"), tmp_path / "g.log")
        with pytest.raises(FileNotFoundError):
            await g.spawn()
        assert len(started) == 1
        assert await asyncio.wait_for(started[0].reap(), 10) == -signal.SIGKILL

    asyncio.run(run())


def test_a_killed_worker_reads_as_exited_before_asyncio_reaps_it(tmp_path):
    """The proxy asks exited() before it sends: a worker killed a moment ago must not take a
    request over a pooled connection (the break would read as dying of that request)."""

    async def go():
        w = WorkerProcess("m", [], tmp_path / "m.log")
        w.command = ["sh", "-c", "exec sleep 30", "sh"]  # stands in for the interpreter
        await w.spawn()
        assert w.pid is not None and not w.exited()
        os.kill(w.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the event loop never runs here: nothing reaps
            try:
                if psutil.Process(w.pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.01)
        assert w.returncode is None and w.exited()
        await w.proc.wait()
        assert w.exited()

    asyncio.run(go())
