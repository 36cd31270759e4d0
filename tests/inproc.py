"""A worker's state in the test's own process: the tiny model loaded, its engine running, and
the spec an app is built from (tests that drive the worker's app without a process)."""

from __future__ import annotations

from pathlib import Path

from mlxd.shared.worker_spec import WorkerSpec
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
