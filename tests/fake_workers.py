"""Fake workers for unit tests of the lifecycle: no processes, no sockets, no MLX.

`Fleet` is both the lifecycle's spawner (it makes FakeWorker objects in place of
WorkerProcess) and its upstream pool (it answers /health and /admin/drain for them), so a
test drives loads, evictions, crashes and the watchdog with the real lifecycle code.
`FakeClock` stands in for time.monotonic where a test needs time to pass at once
(keep-alive, the watchdog's silence, crash windows); `make_registry` wires them up, and
`with_app` serves the whole app over them.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path

from mlxd.shared.config_load import load_settings
from mlxd.shared.wire.admin import WorkerHealth
from mlxd.shared.wire.memory import ModelMemory
from mlxd.shared.worker_spec import WorkerSpec
from mlxd.supervisor.registry.registry import Registry

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
        spec = WorkerSpec.from_argv(argv)  # what a real worker would be told
        self.socket, self.generation = spec.socket, spec.generation
        self.memory_limit_bytes = spec.memory_limit_bytes  # the supervisor's share for it
        self.pid: int | None = None
        self.returncode: int | None = None
        self.status = "ok"  # what /health says once loaded: ok, draining, failed
        self.silent = False  # True: /health times out (a hung worker)
        # What /health reports as memory_in_use_bytes once loaded (None: no report).
        self.memory_bytes: int | None = fleet.memory.get(model_id)
        self.report: ModelMemory | None = fleet.reports.get(model_id)  # its parts, when set
        self._exited = asyncio.Event()
        self._loaded_at = 0.0
        self.phase: str | None = None  # what /health says it is doing while loading

    def finish_loading(self) -> None:
        """Be loaded from now on, whatever `load_s` said."""
        self._loaded_at = 0.0

    async def spawn(self) -> None:
        self.pid = next(_pids)
        self._loaded_at = asyncio.get_running_loop().time() + self.fleet.load_s
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.socket.touch()
        self.fleet.by_socket[self.socket] = self
        self.fleet.spawned.append(self)
        if self.fleet.exit_on_start is not None:  # dies while loading, with this code
            asyncio.get_running_loop().call_soon(self._exit, self.fleet.exit_on_start)

    def loaded(self) -> bool:
        return asyncio.get_running_loop().time() >= self._loaded_at

    def _exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set()

    def crash(self, code: int = 1) -> None:
        """Die unexpectedly with exit `code` (negative: killed by that signal)."""
        self._exit(code)

    def terminate(self) -> None:
        self.fleet.terminated.append(self)
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
        self.exit_on_start: int | None = None  # new workers exit with this code at once
        self.drained: list[FakeWorker] = []  # workers asked to drain, in order
        self.terminated: list[FakeWorker] = []  # workers sent SIGTERM, in order
        self.memory: dict[str, int] = {}  # model id -> what its new workers report holding
        self.reports: dict[str, ModelMemory] = {}  # model id -> the same with its parts

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
        if w.silent:
            raise asyncio.TimeoutError()
        if not w.loaded():
            return 503, WorkerHealth(
                status="loading",
                pid=w.pid,
                generation=w.generation,
                model=w.model_id,
                phase=w.phase,
            )
        return (200 if w.status == "ok" else 503), WorkerHealth(
            status=w.status,
            pid=w.pid,
            generation=w.generation,
            model=w.model_id,
            memory_in_use_bytes=w.report.total_bytes if w.report else w.memory_bytes,
            memory=w.report
            or (None if w.memory_bytes is None else ModelMemory(weights_bytes=w.memory_bytes)),
        )

    async def get_json(self, socket: Path, path: str, timeout_s: float) -> tuple[int, dict]:
        status, health = await self.health(socket, timeout_s)
        return status, health.model_dump()

    async def post_json(
        self, socket: Path, path: str, timeout_s: float, body: dict | None = None
    ) -> tuple[int, dict]:
        await asyncio.sleep(0)
        if path == "/admin/drain" and (w := self.by_socket.get(socket)) is not None:
            self.drained.append(w)
        return 200, {"status": "drained"}

    async def close(self, socket: Path) -> None:
        pass

    async def close_all(self) -> None:
        pass


class FakeClock:
    """A monotonic clock that moves only when told to (`advance`)."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_registry(home: Path, fleet: Fleet, *models: str, clock=None, **overrides) -> Registry:
    """A Registry over `fleet` for model folders `models` (1000 bytes each) in `home`."""
    make_models(home, *models)
    extra = {} if clock is None else {"clock": clock}
    return Registry.build(
        settings_for(home, **overrides),
        fleet,
        total_memory_bytes=1 << 34,
        spawner=fleet.spawner,
        **extra,
    )


def with_app(home: Path, go, *models: str, **overrides):
    """Run `await go(client, registry, app)` against the supervisor's whole app (build_app) over
    a fake fleet serving `models` (default "a" and "b"), on a loopback test server that cancels
    a handler whose client left, as the daemon's runner does."""
    from aiohttp.test_utils import TestClient, TestServer

    from mlxd.supervisor.daemon import build_app

    async def main():
        reg = make_registry(home, Fleet(load_s=0), *(models or ("a", "b")), **overrides)
        app = build_app(reg.settings, reg)
        try:
            server = TestServer(app, host="127.0.0.1", handler_cancellation=True)
            async with TestClient(server) as client:
                return await go(client, reg, app)
        finally:
            await reg.shutdown()

    return asyncio.run(main())


async def until(pred, timeout_s: float = 5.0) -> None:
    """Wait (polling) until `pred()` holds; fail after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.002)


async def settled(slot, *states, timeout_s: float = 5.0) -> None:
    """Wait until `slot` is in one of `states`."""
    await until(lambda: slot.state in states, timeout_s)
