"""A worker's state in the test's own process: the tiny model loaded, its engine running, and
the spec an app is built from (tests that drive the worker's app without a process)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from aiohttp.test_utils import TestServer

from mlxd.shared.worker_spec import WorkerSpec
from mlxd.worker.app import build_app
from mlxd.worker.chat.state import WorkerState
from mlxd.worker.engine.loop import Engine
from mlxd.worker.model.load import load_model


def worker_state(model_dir: Path, clock=None, **spec) -> WorkerState:
    """The state build_app serves: no socket, no prompt cache, no warm-up unless `spec` says
    otherwise. Stop its engine after: `state.engine.stop()` and `join`."""
    loaded = load_model(model_dir, "tiny")
    engine = Engine(loaded, batch=4)
    engine.start()
    config = WorkerSpec(
        model_path=model_dir,
        model_id="tiny",
        socket=Path("/nonexistent/never-bound.sock"),
        **{"prompt_cache_bytes": 0, "warmup": False, **spec},
    )
    extra = {} if clock is None else {"clock": clock}
    return WorkerState(config=config, loaded=loaded, engine=engine, started=True, **extra)


def stop_engine(state: WorkerState) -> None:
    state.engine.stop()
    assert state.engine.join(10)


@contextlib.contextmanager
def serving(state: WorkerState, hang_s: float = 120) -> Iterator[str]:
    """The worker's app for `state` on 127.0.0.1, its event loop in a thread of its own (as a
    worker's is, apart from the test's): yields the base URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = TestServer(build_app(state), host="127.0.0.1")
    asyncio.run_coroutine_threadsafe(server.start_server(), loop).result(hang_s)
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(hang_s)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(hang_s)
        loop.close()
