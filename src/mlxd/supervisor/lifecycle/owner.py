"""The lifecycle owner: the one place a worker's state changes.

Load (the load gate, room under the budget, spawn, wait until healthy), reap (crash record,
backoff, FATAL), stop, hot-reload generations, the operator's drain mark, shutdown. Every state
change is a compare-and-swap `slot.transition(expected, to, why)` made here and nowhere else.
Clock, spawner and upstream pool are passed in, so tests run over fakes. Named stops: `unload`
drains, then stops (keep-alive, eviction, operators, reloads); `restart` takes a READY worker
that cannot serve out of routing and stops it, its exit a crash; `shutdown` stops everything,
a worker still starting included, as a clean stop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from mlxd.shared.background import Background
from mlxd.shared.config import Settings
from mlxd.shared.errors import Unavailable
from mlxd.supervisor.catalog.discovery import ModelEntry
from mlxd.supervisor.lifecycle.admission import Admission, make_room, share_bytes
from mlxd.supervisor.lifecycle.counters import Counters
from mlxd.supervisor.lifecycle.crashes import judge_crash
from mlxd.supervisor.lifecycle.drain import drain_worker
from mlxd.supervisor.lifecycle.group import spawn_worker
from mlxd.supervisor.lifecycle.health import ADMIN_HINT, POLL_S, until_healthy
from mlxd.supervisor.lifecycle.launch import log_path, worker_argv
from mlxd.supervisor.lifecycle.process import WorkerProcess
from mlxd.supervisor.lifecycle.slot import DRAINED, ModelSlot
from mlxd.supervisor.lifecycle.states import ALIVE, COLD, MOVING, State
from mlxd.supervisor.lifecycle.upstream import UpstreamPool

log = logging.getLogger("mlxd.registry")


class Lifecycle:
    """Owns every ModelSlot's state: the routing table (`slots`) and a reload's generations."""

    def __init__(
        self,
        settings: Settings,
        upstream: UpstreamPool,
        tasks: Background,
        *,
        budget_bytes: int,
        clock: Callable[[], float] = time.monotonic,
        spawner: Callable[..., WorkerProcess] = spawn_worker,
    ):
        self.settings = settings
        self.upstream = upstream
        self.tasks = tasks
        self.budget_bytes = budget_bytes
        self.clock = clock
        self.spawner = spawner
        self.slots: dict[str, ModelSlot] = {}  # routing: the slot a model's requests reach
        # Slots out of routing during a hot reload: the new one starting, the old one draining.
        self.incoming: set[ModelSlot] = set()
        self.retired: set[ModelSlot] = set()
        self.counters = Counters()
        self.admission = Admission()
        self.room = asyncio.Event()  # set (and replaced) when a lease ends or a worker exits
        self.last_load_s = 0.0  # how long the last start took
        self.closing = False  # shutdown began: nothing starts any more
        self._load_gate = asyncio.Semaphore(settings.max_concurrent_loads)
        self._load_tasks: dict[str, asyncio.Task] = {}

    # -- slots ----------------------------------------------------------------------------
    def slot_for(self, entry: ModelEntry) -> ModelSlot:
        """The routing slot of `entry` (a STOPPED one the first time)."""
        slot = self.slots.get(entry.id)
        if slot is None:
            slot = self.slots[entry.id] = self.new_slot(entry)
        return slot

    def new_slot(self, entry: ModelEntry, generation: int = 0) -> ModelSlot:
        """A STOPPED slot for `entry`; a hot reload makes one per generation (own socket)."""
        return ModelSlot.create(self.settings, entry, generation, now=self.clock())

    def route(self, slot: ModelSlot) -> None:
        """Send `slot.id`'s requests to `slot` from now on (a hot reload's switch, reload.py)."""
        self.slots[slot.id] = slot

    def forget(self, slot: ModelSlot) -> None:
        """Drop a STOPPED slot from routing: its model's folder was deleted or replaced."""
        if slot.state is State.STOPPED and self.slots.get(slot.id) is slot:
            del self.slots[slot.id]

    def signal_room(self) -> None:
        """Wake loads waiting for room: a lease ended, a worker exited, a waiter left."""
        self.room.set()
        self.room = asyncio.Event()

    def retry_after_s(self) -> float:
        """What a 503 for a full or slow queue suggests: about one model load."""
        return min(60.0, max(1.0, self.last_load_s or 5.0))

    @property
    def load_gate_busy(self) -> bool:
        """Loads hold every place at the gate: a cold model's load would queue behind them."""
        return self._load_gate.locked()

    def load_task(self, model_id: str) -> asyncio.Task | None:
        return self._load_tasks.get(model_id)

    async def wait_settled(self, slot: ModelSlot, step_s: float = 1.0) -> ModelSlot:
        """Wait while `slot` is STARTING, DRAINING or STOPPING (a move is under way)."""
        while slot.state in MOVING:
            await slot.wait_change(step_s)
        return slot

    # -- loading --------------------------------------------------------------------------
    def start_load(self, slot: ModelSlot) -> asyncio.Task:
        """The one load task for `slot` (callers arriving meanwhile share it)."""
        task = self._load_tasks.get(slot.id)
        if task is None or task.done():
            task = asyncio.create_task(self.load_slot(slot))
            # Its waiters read a failure; one that nobody waits for any more is not an error.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._load_tasks[slot.id] = task
        return task

    async def load_slot(self, slot: ModelSlot) -> None:
        """Load `slot` and wait for READY: a routing slot's load task, or a hot reload's next
        generation (outside routing). A crash backoff is slept out before the load gate."""
        if slot.state is State.BACKOFF:
            await asyncio.sleep(max(0.0, slot.backoff_until - self.clock()))
        slot.load_waiting = True
        try:
            async with self._load_gate:
                if self.closing:
                    raise Unavailable("mlxd is shutting down")
                if slot.state not in COLD or slot in self.retired or slot.drained:
                    return  # someone else moved it (an unload, a reload, an operator's drain)
                await make_room(self, slot)
                slot.load_waiting = False
                await self._start_worker(slot)
        finally:
            slot.load_waiting = False

    async def _start_worker(self, slot: ModelSlot) -> None:
        """Spawn the worker (STOPPED -> STARTING) and wait until it proves healthy."""
        if not slot.transition(COLD, State.STARTING):
            return  # moved while this load waited for room
        slot.started_at = self.clock()
        proc = self.spawner(
            slot.id,
            worker_argv(self.settings, slot, share_bytes(self, slot)),
            log_path(self.settings.logs_dir, slot.socket),
        )
        slot.process = proc
        try:
            await proc.spawn()
        except OSError as exc:  # no process, so no reaper: leave STARTING here
            slot.process = None
            slot.last_error = f"cannot start the worker: {exc}"
            slot.public_error = f"cannot start the worker: {exc.strerror or type(exc).__name__}"
            slot.transition(State.STARTING, State.FATAL, slot.last_error)
            raise Unavailable(
                f"Model '{slot.id}' failed to start ({slot.public_error}; "
                f"{ADMIN_HINT.format(slot.id)})"
            ) from None
        self.tasks.spawn(self._reap(slot, proc))
        deadline = self.clock() + self.settings.load_timeout_s
        while await until_healthy(self.upstream, slot, proc, self.clock, deadline):
            now = self.clock()
            if slot.transition(State.STARTING, State.READY, f"pid={proc.pid}"):
                slot.last_health_ok = slot.ready_at = now
                self.last_load_s = now - slot.started_at
                self.counters.loads += 1
                return
            await asyncio.sleep(POLL_S)  # healthy, but moved meanwhile: its exit comes next
        slot.last_error = f"not healthy within {self.settings.load_timeout_s:.0f}s"
        slot.public_error = slot.last_error
        proc.kill()
        raise Unavailable(f"Model '{slot.id}' did not become healthy in time")

    # -- exits ----------------------------------------------------------------------------
    async def _reap(self, slot: ModelSlot, proc: WorkerProcess) -> None:
        """Wait for the worker's exit: the end of a stop (STOPPED), or a crash."""
        code = await proc.reap()
        if slot.process is not proc:
            return  # an older process of a reloaded model
        await self.upstream.close(slot.socket)
        if slot.transition(State.STOPPING, State.STOPPED, f"exit code {code}"):
            slot.process = None
            self.signal_room()
            return
        cause, slot.exit_cause = slot.exit_cause, None
        slot.last_error = proc.describe_exit()
        slot.public_error = proc.exit_summary()
        now = self.clock()
        slot.crashes.append(now)
        self.counters.crashes += 1
        verdict = judge_crash(slot.crashes, now, code, self.settings)
        if cause is None:
            log.error("model=%s worker died: %s", slot.id, slot.last_error)
        else:  # ended by the watchdog: this is the one line that says so
            log.error("watchdog: model=%s %s; restarting it (%s)", slot.id, cause, slot.last_error)
            slot.last_error = f"watchdog: {cause}; {slot.last_error}"
        slot.process = None
        if verdict.fatal:
            slot.transition(ALIVE, State.FATAL, f"{verdict.recent} crashes; {slot.last_error}")
        else:
            slot.backoff_until = now + verdict.delay_s
            slot.restarts += 1
            slot.transition(ALIVE, State.BACKOFF, f"restart allowed in {verdict.delay_s:.0f}s")
        self.signal_room()

    # -- stops ----------------------------------------------------------------------------
    async def unload(
        self, model_id: str, reason: str = "unload", only_if_idle: bool = False
    ) -> bool:
        """Drain and stop `model_id`'s worker; True if it was running. `only_if_idle`:
        keep-alive and eviction decided earlier; a request that took a lease since keeps it."""
        slot = self.slots.get(model_id)
        return slot is not None and await self.unload_slot(slot, reason, only_if_idle)

    async def unload_slot(
        self, slot: ModelSlot, reason: str = "unload", only_if_idle: bool = False
    ) -> bool:
        """Drain and stop this slot's worker (a reload's old one too); True if it was READY."""
        if only_if_idle and (slot.leases or slot.handover):
            return False
        if not slot.transition(State.READY, State.DRAINING, reason):
            return False
        log.info("unloading model=%s reason=%s", slot.id, reason)
        slot.last_drain = await drain_worker(
            self.upstream, slot, self.settings.drain_timeout_s, self.clock
        )
        if not slot.transition(State.DRAINING, State.STOPPING):
            return False  # it died while draining (or a shutdown took it over)
        proc = slot.process
        if proc is not None:
            await proc.stop(self.settings.stop_timeout_s)
        while slot.state is State.STOPPING:
            await slot.wait_change(1.0)
        self.counters.unloads += 1
        return True

    async def restart(
        self, slot: ModelSlot, proc: WorkerProcess, why: str, *, kill: bool = False
    ) -> None:
        """Take a READY slot out of routing and stop its worker; the next request restarts it.

        READY -> DRAINING first, so new requests wait for the restart instead of reaching a
        worker that refuses them; the exit then counts as a crash (backoff, then FATAL if it
        keeps happening)."""
        if slot.process is not proc or not slot.transition(State.READY, State.DRAINING, "watchdog"):
            return
        slot.exit_cause = why  # logged once, with the exit, by the reaper
        if kill:
            proc.kill()
        else:
            await proc.stop(self.settings.stop_timeout_s)

    async def shutdown(self) -> None:
        """Drain the READY workers and stop every other one (the daemon is exiting).

        A worker still starting or draining goes STOPPING ("shutdown"): a clean stop, never
        counted or logged as a crash, never BACKOFF. Nothing starts afterwards."""
        self.closing = True
        for task in list(self._load_tasks.values()):
            task.cancel()
        ready = [s for s in self.slots.values() if s.state is State.READY]
        await asyncio.gather(
            *(self.unload_slot(s, reason="shutdown") for s in ready), return_exceptions=True
        )
        for s in [*self.slots.values(), *self.incoming, *self.retired]:
            await self._stop_for_shutdown(s)
            s.socket.unlink(missing_ok=True)

    async def _stop_for_shutdown(self, slot: ModelSlot) -> None:
        if slot.transition(State.BACKOFF, State.STOPPED, "shutdown"):
            return  # no process, and no restart either
        proc = slot.process
        if proc is None or proc.returncode is not None:
            return
        slot.transition(ALIVE, State.STOPPING, "shutdown")
        if proc.pid is None:  # its spawn was cancelled: no process, so no reaper
            slot.process = None
            slot.transition(State.STOPPING, State.STOPPED, "never spawned")
            return
        await proc.stop(self.settings.stop_timeout_s)
        while slot.state is State.STOPPING and slot.process is proc:
            await slot.wait_change(1.0)

    # -- operator -------------------------------------------------------------------------
    def set_drained(self, slot: ModelSlot, drained: bool, why: str = DRAINED) -> None:
        """The operator's mark: a drained model refuses requests until a load or reload;
        `why` ends the 503 its requests get ("Model 'x' " + why)."""
        slot.drained = drained
        slot.drained_why = why

    def reset(self, slot: ModelSlot) -> bool:
        """FATAL or BACKOFF -> STOPPED for an operator's reload; the crash record starts over."""
        if not slot.transition(frozenset({State.FATAL, State.BACKOFF}), State.STOPPED, "reload"):
            return False
        slot.crashes.clear()
        slot.restarts = 0
        return True
