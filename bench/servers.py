"""Start and stop the servers under test as real processes on loopback, and wait until they
answer. Also the "bare load" baseline: a fresh interpreter that loads a model with mlx-lm.

Every process logs to a file in the run's log folder, so a failed start can be explained.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from .client import Target

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"


class StartError(RuntimeError):
    """A server process exited or never became healthy."""


@dataclass
class ServerProcess:
    """A server we spawned: its process, where it logs, and how the client reaches it."""

    name: str
    proc: subprocess.Popen
    log_path: Path
    target: Target
    spawned_at: float

    def terminate(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace_s`; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log_tail(self, n: int = 15) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Linux: SIGTERM the server if the bench dies without cleaning up (e.g. SIGKILL).

    mlx_lm.server has no such guard of its own, and an orphan would skew the next run.
    """
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        except OSError:
            pass


def _spawn(name: str, cmd: list[str], log_dir: Path, env: dict[str, str] | None = None):
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log = open(log_path, "ab")
    # Model folders are local by contract: never let a server reach for the hub.
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    proc = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
        env=full_env,
        preexec_fn=_die_with_parent,
    )
    log.close()  # the child holds its own descriptor
    return proc, log_path, time.monotonic()


async def wait_healthy(server: ServerProcess, timeout_s: float = 120.0) -> float:
    """Poll GET /health until 200; returns seconds since spawn. Raises StartError."""
    deadline = time.monotonic() + timeout_s
    sock = server.target.unix_socket
    async with server.target.session() as session:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                raise StartError(
                    f"{server.name} exited with {server.proc.returncode}:\n{server.log_tail()}"
                )
            if sock is None or os.path.exists(sock):
                try:
                    async with session.get("/health") as resp:
                        if resp.status == 200:
                            return time.monotonic() - server.spawned_at
                except (aiohttp.ClientError, OSError):
                    pass
            await asyncio.sleep(0.05)
    server.terminate(2.0)
    raise StartError(f"{server.name} not healthy after {timeout_s:.0f}s:\n{server.log_tail()}")


async def start_mlx_lm(model_dir: Path, log_dir: Path, port: int | None = None) -> ServerProcess:
    """`python -m mlx_lm server` on its defaults (batching on), bound to loopback (on `port`,
    else a free one).

    Requests leave out `model`, so it serves the `--model` folder ("default_model").
    """
    port = port or free_port()
    cmd = [
        sys.executable,
        str(Path(__file__).with_name("mlx_lm_capped.py")),  # its buffer cache capped like ours
        "--model",
        str(model_dir),
        "--host",
        LOOPBACK,
        "--port",
        str(port),
    ]
    proc, log_path, t0 = _spawn("mlx_lm", cmd, log_dir)
    target = Target("mlx_lm", "mlx_lm.server", f"http://{LOOPBACK}:{port}")
    server = ServerProcess("mlx_lm", proc, log_path, target, t0)
    await wait_healthy(server)
    return server


async def start_worker(
    model_dir: Path,
    model_id: str,
    sock: Path,
    log_dir: Path,
    name: str = "worker",
    wait: bool = True,
) -> ServerProcess:
    """One mlxd engine worker on a UNIX socket, as the supervisor would start it.

    Its HOME is a fresh folder next to the socket: defaults under `~` (the SSD prompt cache)
    must not persist between runs, or a later run would be served from an earlier one's cache.
    """
    cmd = [
        sys.executable,
        "-m",
        "mlxd.worker",
        "--model-path",
        str(model_dir),
        "--model-id",
        model_id,
        "--socket",
        str(sock),
    ]
    home = sock.parent / f"{name}-home"
    home.mkdir(parents=True, exist_ok=True)
    proc, log_path, t0 = _spawn(name, cmd, log_dir, {"HOME": str(home)})
    target = Target(
        name, "mlxd worker (UNIX socket)", "http://worker", unix_socket=str(sock), model=model_id
    )
    server = ServerProcess(name, proc, log_path, target, t0)
    if wait:
        await wait_healthy(server)
    return server


def mlxd_command() -> list[str] | None:
    """The `mlxd` console script next to this interpreter (or on PATH), if installed."""
    local = Path(sys.executable).parent / "mlxd"
    if local.exists():
        return [str(local)]
    found = shutil.which("mlxd")
    return [found] if found else None


def supervisor_available() -> tuple[bool, str]:
    """Whether `mlxd start` exists yet; the reason when it does not."""
    cmd = mlxd_command()
    if cmd is None:
        return False, "no `mlxd` command installed"
    try:
        r = subprocess.run([*cmd, "start", "--help"], capture_output=True, timeout=30, cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"`mlxd start --help` failed: {exc}"
    if r.returncode != 0:
        err = (r.stderr or r.stdout).decode(errors="replace").strip().splitlines()
        return False, f"`mlxd start --help` exited {r.returncode}: {err[-1] if err else ''}"
    return True, ""


async def start_supervisor(
    home: Path,
    model_id: str,
    log_dir: Path,
    env: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> ServerProcess:
    """`mlxd start` over TCP with `home/models/*` as its models. Raises StartError."""
    cmd = mlxd_command()
    if cmd is None:
        raise StartError("no `mlxd` command installed")
    port = free_port()
    cmd = [*cmd, "start", "--host", LOOPBACK, "--port", str(port), "--home", str(home)]
    # HOME too, so nothing the daemon defaults to under `~` outlives the run.
    proc, log_path, t0 = _spawn("supervisor", cmd, log_dir, {**(env or {}), "HOME": str(home)})
    target = Target("mlxd", "mlxd (supervisor, TCP)", f"http://{LOOPBACK}:{port}", model=model_id)
    server = ServerProcess("supervisor", proc, log_path, target, t0)
    await wait_healthy(server, timeout_s)
    return server


# Runs in a fresh interpreter: what "just load it with mlx-lm" costs, up to the first token.
_BARE_LOAD = """\
import json, sys, time
t0 = time.monotonic()
from mlx_lm import load, stream_generate
t1 = time.monotonic()
model, tok = load(sys.argv[1])
t2 = time.monotonic()
prompt = tok.apply_chat_template([{"role": "user", "content": sys.argv[2]}],
                                 add_generation_prompt=True)
for _ in stream_generate(model, tok, prompt, max_tokens=1):
    break
t3 = time.monotonic()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "first_token_s": t3 - t2}),
      flush=True)
"""


async def bare_load(model_dir: Path, prompt: str) -> dict[str, float]:
    """Spawn a fresh Python that imports mlx-lm, loads `model_dir` and makes one token.

    `total_s` runs from the spawn to the child's report, so it is comparable with a server
    that has to start a process, load, and answer.
    """
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _BARE_LOAD,
        str(model_dir),
        prompt,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    line = await proc.stdout.readline()
    total = time.monotonic() - t0
    _, err = await proc.communicate()
    if not line:
        raise StartError(f"bare mlx_lm.load failed: {err.decode(errors='replace')[-500:]}")
    return {"total_s": total, **json.loads(line)}
