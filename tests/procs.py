"""Start real mlxd processes for tests and wait until they answer."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parents[1]

# Limits of the shared integration worker (tests/integration/conftest.py).
CONTEXT_LIMIT = 512
MAX_BODY_BYTES = 256 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def uds_client(socket: Path, timeout_s: float = 60.0) -> httpx.Client:
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(socket)), base_url="http://worker", timeout=timeout_s
    )


def uds_openai(socket: Path) -> openai.OpenAI:
    """The official SDK talking to a worker's UNIX socket."""
    http = httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), timeout=60.0)
    return openai.OpenAI(
        base_url="http://worker/v1", api_key="unused", http_client=http, max_retries=0
    )


def start_worker(
    model_dir: Path, socket: Path, model_id: str = "tiny", *args: str, log: Path | None = None
) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "mlxd.worker",
        "--model-path",
        str(model_dir),
        "--model-id",
        model_id,
        "--socket",
        str(socket),
        *args,
    ]
    if "--ssd-read-ahead" not in args:
        # Each test here counts the restores its own requests make; the read-ahead at start
        # (tests/e2e/test_ssd_read_ahead.py) would race them for the same entries.
        cmd.append("--no-ssd-read-ahead")
    if "--ssd-cache-dir" not in args and "--no-ssd-cache" not in args:
        # Never the user's home, and one folder per socket so test modules stay independent.
        cmd += ["--ssd-cache-dir", str(socket.parent / f"cache-{socket.stem}")]
    out = open(log, "wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen(
        cmd,
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    wait_healthy(socket, proc)
    return proc


def wait_healthy(socket: Path, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode}")
        if socket.exists():
            try:
                with uds_client(socket, 2.0) as c:
                    if c.get("/health").status_code == 200:
                        return
            except httpx.HTTPError:
                pass
        time.sleep(0.1)
    raise TimeoutError("worker did not become healthy")


def wait_rows(socket: Path, n: int = 1, timeout_s: float = 30.0) -> None:
    """Until the worker at `socket` has at least `n` rows in its batch: a request sent from
    another thread has been admitted (a sleep would guess, on a machine of any speed)."""
    deadline = time.monotonic() + timeout_s
    with uds_client(socket) as c:
        while c.get("/stats").json()["rows_active"] < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {n} rows in the worker's batch in {timeout_s} s")
            time.sleep(0.01)


def stop(proc: subprocess.Popen, timeout_s: float = 15.0) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


# A kv_allowance for tests whose budgets are tight: the supervisor gives each worker at least
# its estimate, and this leaves room for the tiny model's longest row (4096 positions of 4 KiB).
TIGHT_KV_ALLOWANCE = 48 << 20


def estimate_bytes(model_dir: Path, kv_allowance_bytes: int = 2 << 20) -> int:
    """The supervisor's estimate of a model before its worker reports: the weights on disk
    plus kv_allowance_bytes (the e2e daemons' default is 2 MiB)."""
    return sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) + kv_allowance_bytes
