"""What the worker's handlers share: the loaded model, its engine, and whether we admit."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mlxd.shared.errors import BadRequest, NotFound, Unavailable
from mlxd.shared.model_facts import ModelFacts
from mlxd.shared.worker_spec import WorkerSpec
from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.chat.image_memo import DecodedImages
from mlxd.worker.engine.loop import Engine
from mlxd.worker.model.load import LoadedModel
from mlxd.worker.vision.load import VisionParts


@dataclass
class WorkerState:
    config: WorkerSpec
    loaded: LoadedModel | None = None
    draft: LoadedModel | None = None  # speculative decoding's draft model, when configured
    engine: Engine | None = None
    vision: VisionParts | None = None  # a VLM's vision half (worker/vision/): None, text only
    images: DecodedImages = field(default_factory=DecodedImages)  # decoded once per content
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
    # Generating requests being answered now, from their body's parse to their last byte
    # (api/driver.py): the SSD read-ahead reads only while there are none.
    generating: int = 0
    facts: ModelFacts | None = None  # what the folder says: chat or embedding model, pooling
    clock: Callable[[], float] = time.monotonic  # keep-alive ticks and heartbeats (tests fake it)

    def ready(self) -> tuple[LoadedModel, Engine]:
        """The model and engine, or a 503 while loading or draining."""
        if self.draining:
            raise Unavailable("This worker is draining and admits no new requests")
        if self.loaded is None or self.engine is None:
            raise Unavailable("The model is still loading")
        return self.loaded, self.engine


def adapter_ns(state: WorkerState, engine: Engine, adapter: str | None) -> str:
    """The prompt-cache namespace of a row with `adapter` (None: the base model's): the
    adapter's weights hash, so no base entry ever serves an adapter row, nor one adapter's
    another's, in RAM or on SSD. 404 for an adapter this worker has not mounted."""
    if adapter is None:
        return state.cache_ns
    mounted = engine.adapters.mounted.get(adapter) if engine.adapters is not None else None
    if mounted is None:
        if engine.adapters is None:
            raise BadRequest("This model's worker serves no LoRA adapters", param="model")
        raise NotFound(
            f"No adapter named {adapter!r} is mounted on {state.config.model_id!r}", param="model"
        )
    return f"{state.cache_ns}{mounted.cache_ns}"
