"""Real `mlxd start` daemons over real sockets, each in its own home folder."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from mlxd.shared.worker_spec import WorkerSpec

from procs import free_port, uds_client


class Daemon:
    """One supervisor process and what a test needs to poke at it."""

    def __init__(self, home: Path, env: dict[str, str], args: list[str]):
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home / "daemon.out"
        cmd = [
            sys.executable,
            "-m",
            "mlxd.supervisor",
            "start",
            "--home",
            str(home),
            "--port",
            str(self.port),
            *args,
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, env={**os.environ, **env}
        )
        self.http = httpx.Client(base_url=self.url, timeout=60)
        deadline = time.monotonic() + 20
        while True:
            try:
                if self.http.get("/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daemon did not start:\n{self.log.read_text()}")
            time.sleep(0.05)

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=60)

    def status(self, model: str) -> dict:
        cards = self.http.get("/v1/models").json()["data"]
        return next(c for c in cards if c["id"] == model)

    def worker_pids(self, model: str | None = None) -> list[int]:
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        pids = []
        for k in kids:
            try:
                cmd = k.cmdline()
            except psutil.Error:
                continue
            if "mlxd.worker" in cmd and (
                model is None or WorkerSpec.from_argv(cmd).model_id == model
            ):
                pids.append(k.pid)
        return pids

    def wait_for(self, pred, timeout_s: float = 20.0, what: str = "condition"):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = pred()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}\n{self.logs()[-3000:]}")

    def logs(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, timeout_s: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.http.close()
        return self.proc.returncode


def _daemon_factory(tiny_model_dir, tiny_model_dir_b):
    """The body of make_daemon and module_daemon: yields the factory, then stops its daemons."""
    made: list[Daemon] = []
    homes: list[Path] = []

    def make(
        models: dict[str, Path] | None = None,
        config: str = "",
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        home: Path | None = None,
    ) -> Daemon:
        """A new daemon; pass the `home` of a stopped one to restart it there."""
        if home is None:
            home = Path(tempfile.mkdtemp(prefix="mlxd-e2e-"))
            homes.append(home)
            if models is None:
                models = {"a": tiny_model_dir, "b": tiny_model_dir_b}
            for name, src in models.items():
                (home / "models").mkdir(exist_ok=True)
                shutil.copytree(src, home / "models" / name)
            (home / "config.toml").write_text(config)
        base_env = {"MLXD_DISCOVER_HF_CACHE": "false", "MLXD_KV_ALLOWANCE_BYTES": str(2 << 20)}
        d = Daemon(home, {**base_env, **(env or {})}, args or [])
        made.append(d)
        return d

    yield make
    for d in made:
        d.stop()
        leftover = d.worker_pids()
        for pid in leftover:
            os.kill(pid, signal.SIGKILL)
        assert not leftover, "workers outlived their daemon"
    for h in homes:
        shutil.rmtree(h, ignore_errors=True)


@pytest.fixture
def make_daemon(tiny_model_dir, tiny_model_dir_b):
    """make_daemon(models={"a": dir, ...}, config="toml text", env={...}) → a running Daemon."""
    yield from _daemon_factory(tiny_model_dir, tiny_model_dir_b)


@pytest.fixture(scope="module")
def module_daemon(tiny_model_dir, tiny_model_dir_b):
    """make_daemon whose daemons last for the whole test module (one daemon, many tests)."""
    yield from _daemon_factory(tiny_model_dir, tiny_model_dir_b)


@pytest.fixture(scope="module")
def make_module_daemon(tiny_model_dir, tiny_model_dir_b):
    """The same as module_daemon (both names are in use)."""
    yield from _daemon_factory(tiny_model_dir, tiny_model_dir_b)


@pytest.fixture(scope="session")
def reported_bytes(tiny_model_dir, tiny_model_dir_b) -> dict[Path, int]:
    """What a worker of each tiny model reports holding (/health memory_in_use_bytes) after
    one request: what the supervisor's budget counts for it once READY. Budgets that must
    hold so many models are built from these (the estimate, weights on disk plus
    kv_allowance, only counts until a worker reports)."""
    factory = _daemon_factory(tiny_model_dir, tiny_model_dir_b)
    d = next(factory)()
    sizes = {}
    for name, folder in (("a", tiny_model_dir), ("b", tiny_model_dir_b)):
        body = {"model": name, "messages": [{"role": "user", "content": "hello"}]}
        assert d.http.post("/v1/chat/completions", json={**body, "max_tokens": 2}).is_success
        with uds_client(d.home / "run" / f"{name}.sock", 10) as c:
            sizes[folder] = c.get("/health").json()["memory_in_use_bytes"]
    for _ in factory:  # stops the daemon
        pass
    return sizes
