"""Leases: a request holds a READY worker from its start to the end of its response.

`acquire` loads the model if need be (through the lifecycle owner) and waits, first come first
served (admission.py), behind other models' requests and loads; the wait is bounded by
queue_timeout_s and queue_size, and a refusal is a 503 with Retry-After. `release` ends a lease;
the last one hands the model to its keep-alive.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from mlxd.shared.errors import Unavailable
from mlxd.supervisor.catalog.catalog import Catalog
from mlxd.supervisor.catalog.discovery import ModelEntry
from mlxd.supervisor.lifecycle.admission import wait_any
from mlxd.supervisor.lifecycle.health import ADMIN_HINT
from mlxd.supervisor.lifecycle.owner import Lifecycle
from mlxd.supervisor.lifecycle.slot import DRAINED, ModelSlot
from mlxd.supervisor.lifecycle.states import COLD, State
from mlxd.supervisor.scheduling import keepalive

# A start ends by itself at load_timeout_s (killed); the slack lets its own error reach the
# waiters first.
START_SLACK_S = 2.0


class Leases:
    """Requests' holds on workers, and the queue of those waiting for one."""

    def __init__(self, lifecycle: Lifecycle, catalog: Catalog):
        self.lifecycle = lifecycle
        self.catalog = catalog
        self.settings = lifecycle.settings

    @contextlib.asynccontextmanager
    async def lease(
        self, model: str | None, keep_alive_s: float | None = None
    ) -> AsyncIterator[ModelSlot]:
        """Hold a READY worker for `model` for the duration of the block.

        `keep_alive_s`: how long the model stays loaded once idle after this request (Ollama's
        per-request keep_alive); None: its configured keep_alive_s. The latest request's
        value is the one that counts, as in Ollama."""
        slot = await self.acquire(self.catalog.resolve(model))
        slot.requested_keep_alive_s = keep_alive_s
        try:
            yield slot
        finally:
            self.release(slot)

    async def acquire(self, entry: ModelEntry) -> ModelSlot:
        """A lease on `entry`'s READY worker; loads it if needed, first come first served.

        Waiting behind other models (for room, a load, a drain) is bounded by queue_timeout_s,
        the model's own start by load_timeout_s; past either, 503 with Retry-After."""
        lc, settings = self.lifecycle, self.settings
        arrived = lc.clock()
        queue_deadline = arrived + settings.queue_timeout_s
        ticket = object()
        handed: ModelSlot | None = None  # the slot whose start this request waited for
        while True:
            if lc.closing:
                raise Unavailable("mlxd is shutting down")
            slot = lc.slot_for(entry)  # looked up each time: a hot reload swaps the slot
            if slot.drained:
                raise Unavailable(f"Model '{slot.id}' {slot.drained_why or DRAINED}")
            if slot.state is State.READY and (slot is handed or lc.admission.admits(slot, arrived)):
                slot.leases += 1
                slot.touch(lc.clock())
                return slot
            if slot.state is State.FATAL:
                # The worker's own error stays on /admin: it can carry paths and log lines.
                raise Unavailable(
                    f"Model '{slot.id}' is FATAL after repeated failures "
                    f"({slot.public_error}; {ADMIN_HINT.format(slot.id)}); reload it to try again"
                )
            held = slot.state is State.READY  # closing: older requests elsewhere go first
            starting = slot.state is State.STARTING
            deadline = (
                max(queue_deadline, slot.started_at + settings.load_timeout_s + START_SLACK_S)
                if starting
                else queue_deadline
            )
            left = deadline - lc.clock()
            if left <= 0:
                what = (
                    "did not become ready in time"
                    if starting
                    else f"was not ready after {settings.queue_timeout_s:g}s in the queue "
                    "(queue_timeout_s): other models kept the memory busy"
                )
                raise Unavailable(f"Model '{slot.id}' {what}", retry_after_s=lc.retry_after_s())
            cold = slot.state in COLD
            # Queued: behind other models' requests, or behind a load or eviction under way.
            if (
                held or slot.load_waiting or (cold and lc.load_gate_busy)
            ) and self.queued() >= settings.queue_size:
                raise Unavailable(
                    "Every loaded model is busy and the load queue is full",
                    retry_after_s=lc.retry_after_s(),
                )
            # The load under way (started here if need be): its failure is ours to report.
            load = lc.start_load(slot) if cold else lc.load_task(slot.id)
            if held or (load is not None and load.done()):
                load = None
            events = [slot.changed, lc.admission.changed] if held else [slot.changed]
            with self._waiting(slot, ticket, arrived, held=held):
                await wait_any(events, load, left)
            if not held:
                handed = slot
            if load is not None and load.done() and not load.cancelled():
                if (failure := load.exception()) is not None:
                    raise failure

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
                self.lifecycle.signal_room()  # a load nobody waits for stops closing others

    def queued(self) -> int:
        """Requests waiting behind other models (bounded by queue_size)."""
        return sum(
            s.held + (s.handover if s.load_waiting else 0) for s in self.lifecycle.slots.values()
        )

    def release(self, slot: ModelSlot) -> None:
        """End one lease on `slot`; the last one frees room and starts its keep-alive."""
        slot.leases -= 1
        slot.touch(self.lifecycle.clock())
        if slot.leases == 0:
            self.lifecycle.signal_room()
            keepalive.on_idle(self.lifecycle, slot)
