"""Operator verbs on one model: load, unload, drain, reload (the /admin API calls these).

- load: start the worker now (it then follows its keep-alive); clears a drain.
- unload: drain and stop; the next request loads it again.
- drain: refuse new requests (503) from now on, let in-flight ones finish, persist the prompt
  cache, stop the worker; it stays stopped until an explicit load or reload.
- reload: a hot swap. A second slot for the same id (generation n+1, its own socket) starts
  while the old one keeps serving; once it is READY the registry's routing entry points at it
  in one step, and the old slot drains (its in-flight requests finish) and stops. If both
  copies do not fit in memory, the old worker is drained first and requests wait for the new
  one (a cold reload). A FATAL or BACKOFF model is reset to STOPPED and loaded.
"""

from __future__ import annotations

import asyncio
import logging

from mlxd.shared.errors import MlxdError, Unavailable
from mlxd.supervisor.lifecycle.admission import residents
from mlxd.supervisor.lifecycle.eviction import DoesNotFit, plan_eviction
from mlxd.supervisor.lifecycle.registry import Registry
from mlxd.supervisor.lifecycle.slot import ModelSlot
from mlxd.supervisor.lifecycle.states import State

log = logging.getLogger("mlxd.ops")

_WAIT_S = 1.0  # how long one wait for a state change lasts before looking again


async def _start(reg: Registry, entry) -> None:
    """Load `entry` for an operator: a failure names the worker's own error (admin only)."""
    try:
        reg.release(await reg.acquire(entry))
    except MlxdError as exc:
        why = reg.slot_for(entry).last_error
        if why:
            exc.message = f"{exc.message}: {why}"
            exc.args = (exc.message,)
        raise


class ModelOps:
    """The operator verbs over one registry; one action per model at a time."""

    def __init__(self, reg: Registry):
        self.reg = reg
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, model_id: str) -> asyncio.Lock:
        return self._locks.setdefault(model_id, asyncio.Lock())

    async def load(self, model_id: str) -> str:
        """Start `model_id` if it is not running; returns "loaded" or "already loaded"."""
        reg = self.reg
        entry = reg.resolve(model_id)
        async with self._lock(entry.id):
            slot = reg.slot_for(entry)
            slot.drained = False
            was_ready = slot.state is State.READY
            await _start(reg, entry)
            return "already loaded" if was_ready else "loaded"

    async def unload(self, model_id: str) -> str:
        """Drain and stop `model_id`; returns "unloaded" or "not running"."""
        reg = self.reg
        entry = _known(reg, model_id)
        async with self._lock(entry.id):
            slot = await _settle(reg.slot_for(entry))
            return "unloaded" if await reg.unload_slot(slot, "admin unload") else "not running"

    async def drain(self, model_id: str) -> str:
        """Take `model_id` out of service until the next load or reload.

        Returns "drained" when a worker was drained and stopped, "not running" otherwise
        (the model is held out of service either way).
        """
        reg = self.reg
        entry = _known(reg, model_id)
        async with self._lock(entry.id):
            slot = reg.slot_for(entry)
            slot.drained = True  # from here on, acquire answers 503
            stopped = await reg.unload_slot(await _settle(slot), "admin drain")
            return "drained" if stopped else "not running"

    async def reload(self, model_id: str) -> str:
        """Hot-swap `model_id`'s worker; returns "reloaded", "reloaded cold" or "loaded"."""
        reg = self.reg
        entry = reg.resolve(model_id)
        async with self._lock(entry.id):
            slot = reg.slot_for(entry)
            slot.drained = False
            slot = await _settle(slot)
            if slot.state in (State.FATAL, State.BACKOFF):
                slot.crashes.clear()
                slot.restarts = 0
                slot.transition(State.STOPPED, "reload")  # FATAL -> STOPPED: operator's reset
            if slot.state is State.STOPPED:
                await _start(reg, entry)
                return "loaded"
            # The folder may have changed (that is often the point): rediscover it.
            new = reg.new_slot(reg.entries().get(slot.id, slot.entry), slot.generation + 1)
            if not _fits_beside(reg, slot, new):
                await reg.unload_slot(slot, "cold reload")
                await _start(reg, entry)
                reg.counters.reloads += 1
                return "reloaded cold"
            await _swap(reg, slot, new)
            reg.counters.reloads += 1
            return "reloaded"


def _known(reg: Registry, model_id: str):
    """The entry of a running model (even if its folder is gone), else of a discovered one."""
    slot = reg.slots.get(model_id)
    return slot.entry if slot is not None else reg.resolve(model_id)


async def _settle(slot: ModelSlot) -> ModelSlot:
    """Wait while `slot` is STARTING, DRAINING or STOPPING (another action is under way)."""
    while slot.state in (State.STARTING, State.DRAINING, State.STOPPING):
        await slot.wait_change(_WAIT_S)
    return slot


def _fits_beside(reg: Registry, old: ModelSlot, new: ModelSlot) -> bool:
    """Can `new` start while `old` (same model) keeps serving?"""
    try:
        return (
            plan_eviction(
                residents(reg, old.id),
                new.footprint_bytes,
                reg.budget_bytes,
                reg.settings.max_loaded_models,
            )
            is not None
        )
    except DoesNotFit:
        return False


async def _swap(reg: Registry, old: ModelSlot, new: ModelSlot) -> None:
    """Start `new` (generation n+1) beside `old`, route to it, then drain and stop `old`."""
    reg.incoming.add(new)
    try:
        await reg.load_slot(new)
    except BaseException as exc:
        if new.process is not None and new.process.returncode is None:
            new.process.kill()
        if isinstance(exc, Exception):
            why = new.last_error or str(exc)
            raise Unavailable(
                f"Reload of '{old.id}' failed ({why}); the old worker keeps serving"
            ) from None
        raise
    finally:
        reg.incoming.discard(new)
    new.last_used = old.last_used
    reg.retired.add(old)
    reg.slots[old.id] = new  # routing switches here; requests holding `old` finish on it
    log.info(
        "model=%s hot swap: generation %d is serving, draining generation %d",
        old.id,
        new.generation,
        old.generation,
    )
    try:
        await reg.unload_slot(old, "hot reload")
        await _settle(old)
    finally:
        reg.retired.discard(old)
