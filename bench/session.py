"""One benchmark session's servers: mlx_lm.server, an mlxd worker, and the mlxd supervisor
when it can start, plus how "serve model B after A" is measured on mlxd's side.

The mlxd target is the supervisor over TCP when `mlxd start` works; otherwise the worker's
UNIX socket stands in for it and the report says so.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as md
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

from .client import Target, stream_chat
from .models import alias_model
from .servers import (
    ROOT,
    ServerProcess,
    start_mlx_lm,
    start_supervisor,
    start_worker,
    supervisor_available,
)

MODEL_A = "bench-a"
# Swap run i asks for "bench-b<i>": a name never served before, so every run is a cold load
# whether or not the supervisor evicts.
MODEL_B = "bench-b{}"
# Evict A to load B, as on a machine that only holds one model.
# The HF cache is left out so the supervisor sees only the bench's models.
SUPERVISOR_ENV = {"MLXD_MAX_LOADED_MODELS": "1", "MLXD_DISCOVER_HF_CACHE": "false"}


class Session:
    """Starts and stops the servers for one model; exposes the targets to the workloads."""

    def __init__(
        self,
        model_a: Path,
        model_b: Path,
        work: Path,
        log_dir: Path,
        swap_runs: int,
        config: str = "",
    ):
        self.model_a, self.model_b = model_a, model_b
        self.config = config  # the supervisor home's config.toml (e.g. model A's adapters)
        self.work, self.log_dir, self.swap_runs = work, log_dir, swap_runs
        self.servers: list[ServerProcess] = []
        self.mlx_lm: Target | None = None
        self.mlxd: Target | None = None
        self.worker: Target | None = None
        self.mlxd_how = ""
        self.swap_how = ""
        self.notes: list[str] = []
        self.server_settings: dict = {}
        self.servers_text = ""

    async def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        mlx_lm = await self._keep(start_mlx_lm(self.model_a, self.log_dir))
        self.mlx_lm = mlx_lm.target
        await self._warm(self.mlx_lm)
        reason = await self._start_supervisor()
        if reason is None:
            # The proxy's yardstick: the supervisor's own worker, reached on its socket (the
            # same process and cache, so the pair differs only by the hop).
            self.worker = Target(
                "worker",
                "the supervisor's worker (UNIX socket)",
                "http://worker",
                unix_socket=str(self.work / "home" / "run" / f"{MODEL_A}.sock"),
                model=MODEL_A,
            )
            self.mlxd_how = "supervisor over TCP (`mlxd start`)"
            self.swap_how = (
                "mlxd: a request for a model not loaded yet; "
                "MLXD_MAX_LOADED_MODELS=1, so A is evicted first; includes the "
                "worker's start."
            )
        else:
            worker = await self._keep(
                start_worker(self.model_a, MODEL_A, self.work / "w.sock", self.log_dir)
            )
            await self._warm(worker.target)
            self.mlxd = dataclasses.replace(
                worker.target, name="mlxd", label="mlxd worker (UNIX socket)"
            )
            self.worker = None
            self.mlxd_how = f"worker UNIX socket directly: supervisor unavailable ({reason})"
            self.notes.append(f"mlxd = the worker socket; the supervisor did not start: {reason}")
            self.swap_how = (
                "mlxd: spawn a fresh worker for B, wait for /health, first token "
                "(no supervisor; A stays loaded)."
            )
        self.server_settings = {
            "mlx_lm.server": "its defaults; requests leave out `model`",
            "mlxd worker": "its defaults (the supervisor's, or `python -m mlxd.worker`)",
            "supervisor_env": SUPERVISOR_ENV if reason is None else None,
        }
        env = " ".join(f"{k}={v}" for k, v in SUPERVISOR_ENV.items())
        self.servers_text = "mlx_lm.server and mlxd on their defaults" + (
            f"; supervisor with {env}" if reason is None else ""
        )

    async def _keep(self, starting) -> ServerProcess:
        server = await starting
        self.servers.append(server)
        return server

    async def _warm(self, target: Target) -> None:
        """Load lazily-loaded models and compile kernels before anything is timed."""
        async with target.session() as s:
            for _ in range(2):
                await stream_chat(s, target, [{"role": "user", "content": "Hello there."}], 8)

    async def _start_supervisor(self) -> str | None:
        """Start `mlxd start` on a home holding A and the B names; None, or why not."""
        ok, reason = supervisor_available()
        if not ok:
            return reason
        home = self.work / "home"
        alias_model(self.model_a, home / "models" / MODEL_A)
        if self.config:
            (home / "config.toml").write_text(self.config)
        for i in range(self.swap_runs):
            alias_model(self.model_b, home / "models" / MODEL_B.format(i))
        try:
            sup = await self._keep(start_supervisor(home, MODEL_A, self.log_dir, SUPERVISOR_ENV))
            await self._warm(sup.target)
        except Exception as exc:  # any failure: fall back to the worker, and say why
            for s in [s for s in self.servers if s.name == "supervisor"]:
                s.terminate(5.0)
                self.servers.remove(s)
            return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
        self.mlxd = sup.target
        return None

    async def stop_mlx_lm(self) -> None:
        """Stop mlx_lm.server, which frees all the device memory it holds (its model, prompt
        cache and MLX's buffers): an exclusive turn of mlxd's gets the whole device."""
        for s in [s for s in self.servers if s.name == "mlx_lm"]:
            s.terminate(10.0)
            self.servers.remove(s)

    async def ensure_mlx_lm(self) -> None:
        """Start mlx_lm.server again on its port (and warm it) if `stop_mlx_lm` stopped it."""
        if self.mlx_lm is None or any(s.name == "mlx_lm" for s in self.servers):
            return
        port = int(self.mlx_lm.base_url.rsplit(":", 1)[1])
        await self._keep(start_mlx_lm(self.model_a, self.log_dir, port))
        await self._warm(self.mlx_lm)

    async def unload_mlxd(self) -> None:
        """Unload model A through the admin API (which drains its prompt cache to SSD)."""
        await admin_action(self.mlxd, MODEL_A, "unload")

    async def mlxd_swap(self, run: int, prompt: str) -> float:
        """Seconds from asking for model B (A being the one in use) to B's first token."""
        messages = [{"role": "user", "content": prompt}]
        if self.worker is not None:  # the supervisor is up
            async with self.mlxd.session() as s:
                await stream_chat(s, self.mlxd, messages, 2)  # A in use
                res = await stream_chat(s, self.mlxd, messages, 1, model=MODEL_B.format(run))
            return res.ttft_s
        t0 = time.monotonic()
        server = await start_worker(
            self.model_b, "bench-b", self.work / f"b{run}.sock", self.log_dir, name=f"worker-b{run}"
        )
        try:
            async with server.target.session() as s:
                sent = time.monotonic()
                res = await stream_chat(s, server.target, messages, 1)
            return sent + res.ttft_s - t0
        finally:
            server.terminate()

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.terminate()
        self.servers.clear()
        # The supervisor's workers log under its home, which goes away with the work dir.
        home_logs = self.work / "home" / "logs"
        if home_logs.is_dir():
            shutil.copytree(home_logs, self.log_dir / "supervisor-home", dirs_exist_ok=True)


async def admin_action(target: Target, model: str, action: str) -> dict:
    """POST /admin/models/<model>/<action> (load, unload, drain, reload) to the supervisor;
    its answer (the action's `result`, `elapsed_s`, the worker's `drain` report)."""
    async with target.session() as s:
        # A JSON body: the supervisor refuses body-less POSTs (no CSRF through forms).
        async with s.post(f"/admin/models/{model}/{action}", json={}) as r:
            r.raise_for_status()
            return await r.json()


def environment(gpu: bool) -> dict:
    """Date-independent facts about this run: machine and versions."""
    mem = ""
    try:
        import psutil

        mem = f", {psutil.virtual_memory().total / 2**30:.0f} GiB RAM"
    except ImportError:
        pass
    machine = (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU cores{mem}, "
        f"MLX device: {'gpu' if gpu else 'cpu'}"
    )
    versions = []
    for pkg in ("mlx", "mlx-lm", "mlxd"):
        try:
            versions.append(f"{pkg} {md.version(pkg)}")
        except md.PackageNotFoundError:
            pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        if commit:
            versions.append(f"commit {commit}{' + local changes' if dirty.strip() else ''}")
    except OSError:
        pass
    versions.append(f"Python {platform.python_version()}")
    return {"machine": machine, "versions": ", ".join(versions)}
