"""One model's place in the supervisor: its state machine, its process, its leases."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlxd.shared.config import ResolvedModelSettings, Settings
from mlxd.shared.wire.admin import WorkerHealth
from mlxd.shared.wire.memory import ModelMemory
from mlxd.supervisor.catalog.discovery import ModelEntry, draft_weights_bytes
from mlxd.supervisor.lifecycle.launch import socket_path
from mlxd.supervisor.lifecycle.process import WorkerProcess
from mlxd.supervisor.lifecycle.states import InvalidTransition, State, is_valid_transition

log = logging.getLogger("mlxd.lifecycle")


# What a request for a model an operator drained is told (after "Model 'x' ").
DRAINED = "was drained by an operator; load or reload it to serve it again"


@dataclass(eq=False)
class ModelSlot:
    """Everything the supervisor knows about one model. Only `transition` changes `state`.

    The lifecycle owner changes the state, the crash record and the operator's `drained`
    mark; leases.py changes the lease and queue counts."""

    entry: ModelEntry
    settings: ResolvedModelSettings  # the model's section, fallbacks filled in
    socket: Path
    estimate_bytes: int  # weights on disk + kv_allowance: what the budget counts before READY
    state: State = State.STOPPED
    process: WorkerProcess | None = None
    leases: int = 0
    last_used: float = field(default_factory=time.monotonic)
    crashes: collections.deque = field(default_factory=lambda: collections.deque(maxlen=64))
    restarts: int = 0
    backoff_until: float = 0.0
    last_error: str | None = None  # the whole story, log lines included: /admin only
    public_error: str | None = None  # the same failure in a sentence a /v1 client may see
    # Why the supervisor itself ended the running worker (the watchdog's verdict): its reaper
    # says it in the exit's one log line instead of a second line at the kill.
    exit_cause: str | None = None
    last_health_ok: float = 0.0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    started_at: float = 0.0
    generation: int = 0  # bumped by each hot reload (the new worker gets its own socket)
    waiting: int = 0  # requests waiting for this model to become READY
    # Of those, the ones that will take a lease the moment it is READY: eviction counts them
    # as leases, so a model just loaded serves its waiters before it can be evicted.
    handover: int = 0
    held: int = 0  # waiting while READY: they arrived after a waiting load closed it
    wait_since: dict = field(default_factory=dict)  # waiting request -> when it arrived
    load_waiting: bool = False  # its load waits for the load gate or for room
    ready_at: float = 0.0  # lifecycle clock at the last STARTING -> READY
    drained: bool = False  # an operator drained it: refuse requests until load or reload
    drained_why: str = ""  # what the 503 says after "Model 'x' " (Lifecycle.set_drained)
    last_drain: dict | None = None  # the worker's answer to its last drain
    # The keep-alive the latest request asked for (Ollama's keep_alive); None: the setting's.
    requested_keep_alive_s: float | None = None
    # What the running worker's /health last said it holds (weights, prompt cache, KV in
    # flight); None until it is READY. Set at READY and by each watchdog probe.
    reported: ModelMemory | None = None
    # While STARTING: what the worker says it is doing (its /health phase); None otherwise.
    phase: str | None = None

    @classmethod
    def create(
        cls, settings: Settings, entry: ModelEntry, generation: int = 0, *, now: float
    ) -> ModelSlot:
        """A STOPPED slot for `entry`; generation n (a hot reload's) gets its own socket."""
        ms = settings.for_model(entry.id)
        return cls(
            entry=entry,
            settings=ms,
            socket=socket_path(settings.run_dir, entry.id, generation),
            estimate_bytes=entry.weights_bytes + draft_weights_bytes(ms) + ms.kv_allowance_bytes,
            generation=generation,
            last_used=now,
        )

    @property
    def id(self) -> str:
        return self.entry.id

    @property
    def memory(self) -> ModelMemory:
        """This model's memory, the one figure every view shows: its worker's own report once
        READY, the estimate before (and for a worker that never reported). A worker group's
        rank 0 reports its own shard: each rank on this host holds about as much."""
        if self.reported is None:
            return ModelMemory.estimate(self.estimate_bytes, self.settings.kv_allowance_bytes)
        return self.reported.times(self.settings.local_ranks)

    @property
    def footprint_bytes(self) -> int:
        """What the memory budget counts for this model: its memory's total."""
        return self.memory.total_bytes

    def record_health(self, health: WorkerHealth) -> None:
        """Keep what a healthy worker of this slot reports of its memory."""
        if health.memory is not None:
            self.reported = health.memory

    def record_phase(self, phase: str, now: float) -> None:
        """A starting worker entered `phase`: logged once, on the terminal too, so a long
        load shows where it is (mlxctl load and the dashboard read it from /admin/models)."""
        if phase != self.phase:
            self.phase = phase
            log.info("model=%s loading: %s (%.1fs)", self.id, phase, now - self.started_at)

    @property
    def keep_alive_s(self) -> float:
        """How long the model stays loaded once idle (0: unload at once, -1: never)."""
        requested = self.requested_keep_alive_s
        return self.settings.keep_alive_s if requested is None else requested

    def transition(self, expected: State | frozenset[State], to: State, why: str = "") -> bool:
        """Compare and swap: move to `to` if the state is `expected` (or one of a set of them).

        False, and nothing changes, when the state is another: someone moved it first. A move
        the state machine forbids raises. Only the lifecycle owner (owner.py) calls this; it
        wakes everyone waiting on a change."""
        sources = expected if isinstance(expected, frozenset) else frozenset({expected})
        for src in sources:
            if not is_valid_transition(src, to):
                raise InvalidTransition(self.id, src, to)
        if self.state not in sources:
            return False
        log.info(
            "model=%s from=%s to=%s%s",
            self.id,
            self.state.value,
            to.value,
            f" ({why})" if why else "",
        )
        self.state = to
        if to in (State.STARTING, State.STOPPED, State.BACKOFF, State.FATAL):
            self.reported = None  # no worker, or a new one: back to the estimate
        self.phase = None  # a new state: no start-up phase until the worker reports one
        if to is State.STOPPED:  # a request's keep_alive lasts as long as the worker it kept
            self.requested_keep_alive_s = None
        self.changed.set()
        self.changed = asyncio.Event()
        return True

    async def wait_change(self, timeout_s: float | None = None) -> bool:
        """Wait for the next transition; False when `timeout_s` passed first."""
        try:
            await asyncio.wait_for(self.changed.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    def touch(self, now: float) -> None:
        """A lease began or ended at `now` (the lifecycle's clock): keep-alive counts from it."""
        self.last_used = now

    def identity_mismatch(self, health: WorkerHealth) -> str | None:
        """Why the worker answering on our socket is not this slot's process (None: it is).

        A socket path can be answered by a stale worker: another daemon's, or an older
        generation's. Routing to it would serve from a process nobody supervises."""
        pid = self.process.pid if self.process is not None else None
        if (health.pid, health.generation) == (pid, self.generation) and health.model == self.id:
            return None
        return (
            f"pid={health.pid} generation={health.generation} model={health.model!r}, "
            f"expected pid={pid} generation={self.generation} model={self.id!r}"
        )
