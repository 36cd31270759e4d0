"""Fake workers for unit tests of the registry: no processes, no sockets, no MLX.

`Fleet` is both the registry's spawner (it makes FakeWorker objects in place of
WorkerProcess) and its upstream pool (it answers /health and /admin/drain for them), so a
test drives loads, evictions and the watchdog with the real registry code.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

from mlxd.shared.config import load_settings
from mlxd.shared.wire.admin import WorkerHealth

_pids = itertools.count(40_000)


def make_models(home: Path, *names: str, weights_bytes: int = 1000) -> None:
    """Model folders whose footprint is `weights_bytes` (with kv_allowance_bytes 0)."""
    for name in names:
        d = home / "models" / name
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
        (d / "model.safetensors").write_bytes(b"\0" * weights_bytes)


def settings_for(home: Path, **overrides):
    base = {
        "home": str(home),
        "discover_hf_cache": False,
        "kv_allowance_bytes": 0,
        "keep_alive_s": -1,
        "backoff_initial_s": 0.05,
        "stop_timeout_s": 1.0,
    }
    return load_settings({**base, **overrides})


class FakeWorker:
    """One pretend worker: 'loads' for `load_s`, then reports itself healthy."""

    def __init__(self, fleet: Fleet, model_id: str, argv: list[str], log_path: Path):
        self.fleet = fleet
        self.model_id = model_id
        self.socket = Path(argv[argv.index("--socket") + 1])
        self.generation = int(argv[argv.index("--generation") + 1]) if "--generation" in argv else 0
        self.pid: int | None = None
        self.returncode: int | None = None
        self.status = "ok"  # what /health says once loaded: ok, draining, failed
        self._exited = asyncio.Event()
        self._loaded_at = 0.0

    async def spawn(self) -> None:
        self.pid = next(_pids)
        self._loaded_at = asyncio.get_running_loop().time() + self.fleet.load_s
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.socket.touch()
        self.fleet.by_socket[self.socket] = self
        self.fleet.spawned.append(self)

    def loaded(self) -> bool:
        return asyncio.get_running_loop().time() >= self._loaded_at

    def _exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set()

    def terminate(self) -> None:
        self._exit(0)

    def kill(self) -> None:
        self._exit(-9)

    async def reap(self) -> int:
        await self._exited.wait()
        return self.returncode

    async def stop(self, timeout_s: float) -> int:
        self.terminate()
        return await self.reap()

    def describe_exit(self) -> str:
        return f"exit code {self.returncode}"

    def exit_summary(self) -> str:
        return f"exit code {self.returncode}"


class Fleet:
    """Spawner and upstream pool for FakeWorkers."""

    def __init__(self, load_s: float = 0.05):
        self.load_s = load_s
        self.by_socket: dict[Path, FakeWorker] = {}
        self.spawned: list[FakeWorker] = []
        self.impostor: WorkerHealth | None = None  # answers every socket while set

    def spawner(self, model_id: str, argv: list[str], log_path: Path) -> FakeWorker:
        return FakeWorker(self, model_id, argv, log_path)

    def loads(self) -> list[str]:
        return [w.model_id for w in self.spawned]

    async def health(self, socket: Path, timeout_s: float) -> tuple[int, WorkerHealth]:
        await asyncio.sleep(0)
        if self.impostor is not None:
            return 200, self.impostor
        w = self.by_socket.get(socket)
        if w is None or w.returncode is not None:
            raise ConnectionRefusedError(socket)
        if not w.loaded():
            return 503, WorkerHealth(
                status="loading", pid=w.pid, generation=w.generation, model=w.model_id
            )
        return (200 if w.status == "ok" else 503), WorkerHealth(
            status=w.status, pid=w.pid, generation=w.generation, model=w.model_id
        )

    async def get_json(self, socket: Path, path: str, timeout_s: float) -> tuple[int, dict]:
        status, health = await self.health(socket, timeout_s)
        return status, health.model_dump()

    async def post_json(
        self, socket: Path, path: str, timeout_s: float, body: dict | None = None
    ) -> tuple[int, dict]:
        await asyncio.sleep(0)
        return 200, {"status": "drained"}

    async def close(self, socket: Path) -> None:
        pass

    async def close_all(self) -> None:
        pass
