"""One model's place in the supervisor: its state machine, its process, its leases."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlxd.shared.config import ModelSettings

from .child import WorkerProcess
from .discovery import ModelEntry
from .states import InvalidTransition, State, is_valid_transition

log = logging.getLogger("mlxd.lifecycle")


@dataclass(eq=False)
class ModelSlot:
    """Everything the supervisor knows about one model. Only `transition` changes `state`."""

    entry: ModelEntry
    settings: ModelSettings
    socket: Path
    footprint_bytes: int
    state: State = State.STOPPED
    process: WorkerProcess | None = None
    leases: int = 0
    last_used: float = field(default_factory=time.monotonic)
    crashes: collections.deque = field(default_factory=lambda: collections.deque(maxlen=64))
    restarts: int = 0
    backoff_until: float = 0.0
    last_error: str | None = None
    last_health_ok: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    started_at: float = 0.0
    generation: int = 0  # bumped by each hot reload (the new worker gets its own socket)
    waiting: int = 0  # requests waiting for this model to become READY
    drained: bool = False  # an operator drained it: refuse requests until load or reload
    last_drain: dict | None = None  # the worker's answer to its last drain

    @property
    def id(self) -> str:
        return self.entry.id

    def transition(self, to: State, why: str = "") -> None:
        """Move to `to`; invalid moves raise. Wakes everyone waiting on a change."""
        if not is_valid_transition(self.state, to):
            raise InvalidTransition(self.id, self.state, to)
        log.info("model=%s from=%s to=%s%s", self.id, self.state.value, to.value,
                 f" ({why})" if why else "")
        self.state = to
        self.changed.set()
        self.changed = asyncio.Event()

    async def wait_change(self, timeout_s: float | None = None) -> bool:
        """Wait for the next transition; False when `timeout_s` passed first."""
        try:
            await asyncio.wait_for(self.changed.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    def touch(self) -> None:
        self.last_used = time.monotonic()
