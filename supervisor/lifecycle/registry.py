"""The registry: which models exist, which run, who holds them, and how they load and stop.

Requests `lease` a model (loading it if needed, waiting for a load in progress) and `release`
it when their response ends. Loads go one at a time (configurable) and first make room under
the memory budget by evicting idle models, least recently used first; models competing for
room are served first come, first served (admission.py). Every unload drains.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from mlxd.shared.config import Settings
from mlxd.shared.errors import BadRequest, ModelNotFound, Unavailable
from mlxd.shared.exit_codes import NO_RESTART
from mlxd.supervisor.catalog.discovery import ModelEntry, discover
from mlxd.supervisor.http.upstream import UpstreamPool
from mlxd.supervisor.lifecycle.admission import Admission, make_room, wait_any
from mlxd.supervisor.lifecycle.launch import worker_argv
from mlxd.supervisor.lifecycle.process import WorkerProcess
from mlxd.supervisor.lifecycle.slot import ModelSlot
from mlxd.supervisor.lifecycle.states import State

log = logging.getLogger("mlxd.registry")

# A worker's drain: its rows (drain_timeout_s), then cancelled rows leave (5 s), then its
# prompt cache is written and fsynced (at most 30 s to queue, 120 s to flush).
PERSIST_BUDGET_S = 160.0
# Where a client is sent for a worker's failure: /v1 errors never carry it (paths, log lines).
ADMIN_HINT = "why: mlxctl ps, or GET /admin/models/{}"
START_SLACK_S = 2.0


class Counters:
    """Lifecycle events, for /metrics and /admin."""

    def __init__(self):
        self.loads = 0
        self.load_failures = 0
        self.evictions = 0
        self.unloads = 0
        self.crashes = 0
        self.reloads = 0


class Registry:
    """Owns every ModelSlot. Dependencies (clock, memory size, spawner) are passed in."""

    def __init__(
        self,
        settings: Settings,
        upstream: UpstreamPool,
        *,
        total_memory_bytes: int,
        clock: Callable[[], float] = time.monotonic,
        spawner: Callable[..., WorkerProcess] = WorkerProcess,
    ):
        self.settings = settings
        self.upstream = upstream
        self.clock = clock
        self.spawner = spawner
        self.budget_bytes = settings.memory_budget_bytes or int(
            total_memory_bytes * settings.memory_fraction
        )
        self.slots: dict[str, ModelSlot] = {}
        self.pending: dict[str, asyncio.Task] = {}  # models being imported
        # Slots out of routing during a hot reload: the new one starting, the old one draining.
        self.incoming: set[ModelSlot] = set()
        self.retired: set[ModelSlot] = set()
        self.counters = Counters()
        self._load_gate = asyncio.Semaphore(settings.max_concurrent_loads)
        self._load_tasks: dict[str, asyncio.Task] = {}
        self.room = asyncio.Event()  # set (and replaced) when a lease ends or a worker exits
        self.admission = Admission()
        self._last_load_s = 0.0
        self._background: set[asyncio.Task] = set()

    # -- lookup ---------------------------------------------------------------------------
    def entries(self) -> dict[str, ModelEntry]:
        return discover(self.settings)

    def default_model(self) -> str | None:
        if self.settings.default_model:
            return self.settings.default_model
        return next((mid for mid, ms in self.settings.models.items() if ms.default), None)

    async def settle(self, model: str | None) -> None:
        """Wait for a model that is still being imported (the built-in one on first start)."""
        task = self.pending.get(model or self.default_model() or "")
        if task is not None:
            await asyncio.shield(task)

    def resolve(self, model: str | None) -> ModelEntry:
        """The entry a request's `model` names (or the default one)."""
        if not model:
            model = self.default_model()
            if not model:
                raise BadRequest(
                    "The request has no 'model' and no default model is configured", param="model"
                )
        slot = self.slots.get(model)
        if slot is not None and slot.entry.path.exists():
            return slot.entry
        entry = self.entries().get(model)
        if entry is None:
            raise ModelNotFound(model)
        return entry

    def slot_for(self, entry: ModelEntry) -> ModelSlot:
        slot = self.slots.get(entry.id)
        if slot is None:
            slot = self.new_slot(entry)
            self.slots[entry.id] = slot
        return slot

    def new_slot(self, entry: ModelEntry, generation: int = 0) -> ModelSlot:
        """A STOPPED slot for `entry`; a hot reload makes one per generation (own socket)."""
        ms = self.settings.for_model(entry.id)
        allowance = (
            ms.kv_allowance_bytes
            if ms.kv_allowance_bytes is not None
            else self.settings.kv_allowance_bytes
        )
        return ModelSlot(
            entry=entry,
            settings=ms,
            socket=self._socket_path(entry.id, generation),
            footprint_bytes=entry.weights_bytes + allowance,
            generation=generation,
        )

    def _socket_path(self, model_id: str, generation: int = 0) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in model_id)
        gen = f".g{generation}" if generation else ""
        path = self.settings.run_dir / f"{safe}{gen}.sock"
        if len(str(path)) > 100:  # UNIX socket paths are limited to ~104 bytes
            digest = hashlib.sha1(model_id.encode()).hexdigest()[:12]
            path = self.settings.run_dir / f"w-{digest}{gen}.sock"
        return path

    def keep_alive_s(self, slot: ModelSlot) -> float:
        ka = slot.settings.keep_alive_s
        return self.settings.keep_alive_s if ka is None else ka

    # -- leases ---------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(self, model: str | None) -> AsyncIterator[ModelSlot]:
        """Hold a READY worker for `model` for the duration of the block."""
        slot = await self.acquire(self.resolve(model))
        try:
            yield slot
        finally:
            self.release(slot)

    async def acquire(self, entry: ModelEntry) -> ModelSlot:
        """A lease on `entry`'s READY worker; loads it if needed, first come first served.

        Waiting behind other models (for room, a load, a drain) is bounded by queue_timeout_s,
        the model's own start by load_timeout_s; past either, 503 with Retry-After."""
        arrived = self.clock()
        queue_deadline = arrived + self.settings.queue_timeout_s
        ticket = object()
        handed: ModelSlot | None = None  # the slot whose start this request waited for
        while True:
            slot = self.slot_for(entry)  # looked up each time: a hot reload swaps the slot
            if slot.drained:
                raise Unavailable(
                    f"Model '{slot.id}' was drained by an operator; "
                    "load or reload it to serve it again"
                )
            if slot.state is State.READY and (
                slot is handed or self.admission.admits(slot, arrived)
            ):
                slot.leases += 1
                slot.touch()
                return slot
            if slot.state is State.FATAL:
                # The worker's own error stays on /admin: it can carry paths and log lines.
                raise Unavailable(
                    f"Model '{slot.id}' is FATAL after repeated failures "
                    f"({slot.public_error}; {ADMIN_HINT.format(slot.id)}); reload it to try again"
                )
            held = slot.state is State.READY  # closing: older requests elsewhere go first
            starting = slot.state is State.STARTING
            # A start ends by itself at load_timeout_s (killed); the slack lets its own
            # error reach the waiters first.
            deadline = (
                max(queue_deadline, slot.started_at + self.settings.load_timeout_s + START_SLACK_S)
                if starting
                else queue_deadline
            )
            left = deadline - self.clock()
            if left <= 0:
                what = (
                    "did not become ready in time"
                    if starting
                    else f"was not ready after {self.settings.queue_timeout_s:g}s in the queue "
                    "(queue_timeout_s): other models kept the memory busy"
                )
                raise Unavailable(f"Model '{slot.id}' {what}", retry_after_s=self.retry_after_s())
            cold = slot.state in (State.STOPPED, State.BACKOFF)
            # Queued: behind other models' requests, or behind a load or eviction under way.
            if (
                held or slot.load_waiting or (cold and self._load_gate.locked())
            ) and self.queued() >= self.settings.queue_size:
                raise Unavailable(
                    "Every loaded model is busy and the load queue is full",
                    retry_after_s=self.retry_after_s(),
                )
            # The load under way (started here if need be): its failure is ours to report.
            load = self._start_load(slot) if cold else self._load_tasks.get(slot.id)
            if held or (load is not None and load.done()):
                load = None
            events = [slot.changed, self.admission.changed] if held else [slot.changed]
            with self._waiting(slot, ticket, arrived, held=held):
                await wait_any(events, load, left)
            if not held:
                handed = slot
            if (
                load is not None
                and load.done()
                and not load.cancelled()
                and load.exception() is not None
            ):
                raise load.exception()

    @contextlib.contextmanager
    def _waiting(self, slot: ModelSlot, ticket: object, arrived: float, *, held: bool):
        """Count one waiting request on `slot` (see ModelSlot.handover and .held)."""
        slot.waiting += 1
        slot.wait_since[ticket] = arrived
        slot.held += held
        slot.handover += not held
        try:
            yield
        finally:
            slot.waiting -= 1
            slot.wait_since.pop(ticket, None)
            slot.held -= held
            slot.handover -= not held
            if not slot.handover:
                self._signal_room()  # a load nobody waits for any more stops closing others

    def queued(self) -> int:
        """Requests waiting behind other models (bounded by queue_size)."""
        return sum(s.held + (s.handover if s.load_waiting else 0) for s in self.slots.values())

    def retry_after_s(self) -> float:
        """What a 503 for a full or slow queue suggests: about one model load."""
        return min(60.0, max(1.0, self._last_load_s or 5.0))

    def release(self, slot: ModelSlot) -> None:
        slot.leases -= 1
        slot.touch()
        if slot.leases == 0:
            self._signal_room()
            if self.keep_alive_s(slot) == 0 and not slot.settings.pinned:
                self.spawn_task(self.unload_slot(slot, "keep_alive 0", only_if_idle=True))

    def _signal_room(self) -> None:
        self.room.set()
        self.room = asyncio.Event()

    def spawn_task(self, coro, *, inherit_context: bool = False) -> asyncio.Task:
        # Background work outlives the request that started it: by default its log lines
        # must not carry that request's id (see shared/logs.py).
        ctx = contextvars.copy_context() if inherit_context else contextvars.Context()
        task = ctx.run(asyncio.create_task, coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # -- loading --------------------------------------------------------------------------
    def _start_load(self, slot: ModelSlot) -> asyncio.Task:
        """The one load task for `slot` (callers arriving meanwhile share it)."""
        task = self._load_tasks.get(slot.id)
        if task is None or task.done():
            task = asyncio.create_task(self._load(slot))
            # Its waiters read a failure; one that nobody waits for any more is not an error.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._load_tasks[slot.id] = task
        return task

    async def load_slot(self, slot: ModelSlot) -> None:
        """Start a slot outside routing (a hot reload's next generation) and wait for READY."""
        await self._load(slot)

    async def _load(self, slot: ModelSlot) -> None:
        # Sleep out a crash backoff before taking the load gate: other models keep loading.
        if slot.state is State.BACKOFF:
            await asyncio.sleep(max(0.0, slot.backoff_until - self.clock()))
        slot.load_waiting = True
        try:
            async with self._load_gate:
                if (
                    slot.state not in (State.STOPPED, State.BACKOFF)
                    or slot in self.retired
                    or slot.drained
                ):
                    return  # someone else moved it (an unload, a reload, an operator's drain)
                await make_room(self, slot)
                slot.load_waiting = False
                await self._start_worker(slot)
        finally:
            slot.load_waiting = False

    async def _start_worker(self, slot: ModelSlot) -> None:
        """Spawn the worker (STOPPED -> STARTING) and wait until it proves healthy."""
        slot.transition(State.STARTING)
        slot.started_at = self.clock()
        proc = self.spawner(
            slot.id,
            worker_argv(self.settings, slot),
            self.settings.logs_dir / f"{slot.socket.stem}.log",
        )
        slot.process = proc
        try:
            await proc.spawn()
        except OSError as exc:  # no process, so no reaper: leave STARTING here
            slot.process = None
            slot.last_error = f"cannot start the worker: {exc}"
            slot.public_error = f"cannot start the worker: {exc.strerror or type(exc).__name__}"
            slot.transition(State.FATAL, slot.last_error)
            raise Unavailable(
                f"Model '{slot.id}' failed to start ({slot.public_error}; "
                f"{ADMIN_HINT.format(slot.id)})"
            ) from None
        self.spawn_task(self._reap(slot, proc))
        await self._wait_healthy(slot, proc)

    async def _wait_healthy(self, slot: ModelSlot, proc: WorkerProcess) -> None:
        deadline = self.clock() + self.settings.load_timeout_s
        warned = False
        while self.clock() < deadline:
            if proc.returncode is not None or slot.process is not proc:
                why = slot.public_error if slot.process is not proc else proc.exit_summary()
                raise Unavailable(
                    f"Model '{slot.id}' failed to start ({why}; {ADMIN_HINT.format(slot.id)})"
                )
            if slot.socket.exists():
                try:
                    status, health = await self.upstream.health(slot.socket, 2.0)
                except (OSError, asyncio.TimeoutError, Exception):  # not listening yet
                    status, health = None, None
                wrong = health is not None and slot.identity_mismatch(health)
                if wrong:
                    # Not our process (a stale worker on this path): never adopt it. A fresh
                    # connection reaches our worker once it has bound the path.
                    if not warned:
                        log.warning(
                            "model=%s socket answered by another worker (%s); not adopting it",
                            slot.id,
                            wrong,
                        )
                        warned = True
                    await self.upstream.close(slot.socket)
                elif status == 200 and health.status == "ok" and slot.state is State.STARTING:
                    now = self.clock()
                    slot.last_health_ok = slot.ready_at = now
                    self._last_load_s = now - slot.started_at
                    slot.transition(State.READY, f"pid={proc.pid}")
                    self.counters.loads += 1
                    return
            await asyncio.sleep(0.05)
        slot.last_error = f"not healthy within {self.settings.load_timeout_s:.0f}s"
        slot.public_error = slot.last_error
        proc.kill()
        raise Unavailable(f"Model '{slot.id}' did not become healthy in time")

    async def _reap(self, slot: ModelSlot, proc: WorkerProcess) -> None:
        code = await proc.reap()
        if slot.process is not proc:
            return  # an older process of a reloaded model
        await self.upstream.close(slot.socket)
        if slot.state is State.STOPPING:
            slot.process = None
            slot.transition(State.STOPPED, f"exit code {code}")
            self._signal_room()
            return
        slot.last_error = proc.describe_exit()
        slot.public_error = proc.exit_summary()
        now = self.clock()
        slot.crashes.append(now)
        self.counters.crashes += 1
        recent = [t for t in slot.crashes if now - t <= self.settings.crash_window_s]
        log.error("model=%s worker died: %s", slot.id, slot.last_error)
        slot.process = None
        if code in NO_RESTART or len(recent) >= self.settings.crash_limit:
            slot.transition(State.FATAL, f"{len(recent)} crashes; {slot.last_error}")
        else:
            delay = min(
                self.settings.backoff_initial_s * 2 ** (len(recent) - 1),
                self.settings.backoff_max_s,
            )
            slot.backoff_until = now + delay
            slot.restarts += 1
            slot.transition(State.BACKOFF, f"restart allowed in {delay:.0f}s")
        self._signal_room()

    # -- stopping -------------------------------------------------------------------------
    async def unload(
        self, model_id: str, reason: str = "unload", only_if_idle: bool = False
    ) -> bool:
        """Drain and stop `model_id`'s worker; True if it was running.

        `only_if_idle`: keep-alive and eviction decided on an earlier loop turn; a request
        that took a lease since then keeps the model."""
        slot = self.slots.get(model_id)
        return slot is not None and await self.unload_slot(slot, reason, only_if_idle)

    async def unload_slot(
        self, slot: ModelSlot, reason: str = "unload", only_if_idle: bool = False
    ) -> bool:
        """Drain and stop this slot's worker (a reload's old one too); True if it was READY."""
        if slot.state is not State.READY or (only_if_idle and (slot.leases or slot.handover)):
            return False
        log.info("unloading model=%s reason=%s", slot.id, reason)
        slot.transition(State.DRAINING, reason)
        slot.last_drain = await self.drain_worker(slot)
        if slot.state is not State.DRAINING:
            return False  # it died while draining
        slot.transition(State.STOPPING)
        proc = slot.process
        if proc is not None:
            await proc.stop(self.settings.stop_timeout_s)
        while slot.state is State.STOPPING:
            await slot.wait_change(1.0)
        self.counters.unloads += 1
        return True

    async def drain_worker(self, slot: ModelSlot) -> dict:
        """Ask the worker to finish its rows and persist its cache; wait for in-flight leases."""
        deadline = self.clock() + self.settings.drain_timeout_s
        while slot.leases > 0 and self.clock() < deadline and slot.state is State.DRAINING:
            await asyncio.sleep(0.05)
        try:
            status, body = await self.upstream.post_json(
                slot.socket, "/admin/drain", self.settings.drain_timeout_s + PERSIST_BUDGET_S
            )
            return body if status == 200 else {}
        except Exception as exc:  # a worker without a drain route, or one that just died
            log.debug("drain model=%s: %s", slot.id, exc)
            return {}

    async def shutdown(self) -> None:
        """Drain and stop every worker (the daemon is exiting)."""
        for task in list(self._load_tasks.values()):
            task.cancel()
        running = [s for s in self.slots.values() if s.state is State.READY]
        await asyncio.gather(
            *(self.unload(s.id, reason="shutdown") for s in running), return_exceptions=True
        )
        for s in [*self.slots.values(), *self.incoming, *self.retired]:
            if s.process is not None and s.process.returncode is None:
                await s.process.stop(self.settings.stop_timeout_s)
            s.socket.unlink(missing_ok=True)
        for task in list(self._background):
            task.cancel()
        await self.upstream.close_all()
