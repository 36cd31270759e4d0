"""What the worker's handlers share: the loaded model, its engine, and whether we admit."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mlxd.shared.errors import Unavailable
from mlxd.shared.model_facts import ModelFacts
from mlxd.shared.worker_spec import WorkerSpec
from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.engine.loop import Engine
from mlxd.worker.model.load import LoadedModel


@dataclass
class WorkerState:
    config: WorkerSpec
    loaded: LoadedModel | None = None
    draft: LoadedModel | None = None  # speculative decoding's draft model, when configured
    engine: Engine | None = None
    draining: bool = False
    # Start-up finished: model loaded, prompt cache (SSD scan) ready, engine running. /health
    # says ok only after this, so a worker is never READY mid-scan.
    started: bool = False
    # What the start-up is doing now, for /health while loading: the supervisor shows it
    # (mlxctl load, the dashboard, its terminal) so a long load is never a silence.
    phase: str = "starting"
    load_error: str | None = None
    prompt_cache: PromptCache | None = None
    cache_ns: str = ""
    counters: dict = field(default_factory=lambda: {"requests": 0, "errors_4xx": 0})
    facts: ModelFacts | None = None  # what the folder says: chat or embedding model, pooling
    clock: Callable[[], float] = time.monotonic  # keep-alive ticks and heartbeats (tests fake it)

    def ready(self) -> tuple[LoadedModel, Engine]:
        """The model and engine, or a 503 while loading or draining."""
        if self.draining:
            raise Unavailable("This worker is draining and admits no new requests")
        if self.loaded is None or self.engine is None:
            raise Unavailable("The model is still loading")
        return self.loaded, self.engine
