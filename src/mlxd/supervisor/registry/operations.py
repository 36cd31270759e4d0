"""Operator verbs on one model: load, unload, drain, reload (the /admin API calls these).

- load: start the worker now (it then follows its keep-alive); clears a drain.
- unload: drain and stop; the next request loads it again.
- drain: refuse new requests (503) from now on, let in-flight ones finish, persist the prompt
  cache, stop the worker; it stays stopped until an explicit load or reload.
- reload: a hot swap. A second slot for the same id (generation n+1, its own socket) starts
  while the old one keeps serving; once it is READY the routing entry points at it in one
  step, and the old slot drains (its in-flight requests finish) and stops. If both
  copies do not fit in memory, the old worker is drained first and requests wait for the new
  one (a cold reload). A FATAL or BACKOFF model is reset to STOPPED and loaded.
- retire: a model whose folder is deleted or replaced (Ollama's /api/delete, /api/create):
  drained and stopped, out of service while its folder changes, then dropped from routing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from mlxd.shared.errors import MlxdError
from mlxd.supervisor.catalog.discovery import ModelEntry
from mlxd.supervisor.lifecycle.admission import residents
from mlxd.supervisor.lifecycle.owner import Lifecycle
from mlxd.supervisor.lifecycle.reload import hot_swap
from mlxd.supervisor.lifecycle.slot import ModelSlot
from mlxd.supervisor.lifecycle.states import State
from mlxd.supervisor.policy.eviction import DoesNotFit, plan_eviction
from mlxd.supervisor.registry.registry import Registry

APP_KEY = "model_ops"  # the app's one ModelOps: /admin's verbs and Ollama's /api/delete share it


def ops_of(app) -> ModelOps:
    """The aiohttp app's ModelOps (made on first use): one action per model, whichever API."""
    if APP_KEY not in app:
        app[APP_KEY] = ModelOps(app["registry"])
    return app[APP_KEY]


class ModelOps:
    """The operator verbs over one registry; one action per model at a time.

    Every state change goes through the lifecycle owner (reg.lifecycle)."""

    def __init__(self, reg: Registry):
        self.reg = reg
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, model_id: str) -> asyncio.Lock:
        return self._locks.setdefault(model_id, asyncio.Lock())

    async def _start(self, entry: ModelEntry) -> None:
        """Load `entry` for an operator: a failure names the worker's own error (admin only)."""
        leases = self.reg.leases
        try:
            leases.release(await leases.acquire(entry))
        except MlxdError as exc:
            why = self.reg.lifecycle.slot_for(entry).last_error
            if why:
                exc.message = f"{exc.message}: {why}"
                exc.args = (exc.message,)
            raise

    def _known(self, model_id: str) -> ModelEntry:
        """The entry of a running model (even if its folder is gone), else of a discovered one."""
        slot = self.reg.lifecycle.slots.get(model_id)
        return slot.entry if slot is not None else self.reg.catalog.resolve(model_id)

    async def load(self, model_id: str) -> str:
        """Start `model_id` if it is not running; returns "loaded" or "already loaded"."""
        lc = self.reg.lifecycle
        entry = self.reg.catalog.resolve(model_id)
        async with self._lock(entry.id):
            slot = lc.slot_for(entry)
            lc.set_drained(slot, False)
            was_ready = slot.state is State.READY
            await self._start(entry)
            return "already loaded" if was_ready else "loaded"

    async def unload(self, model_id: str) -> str:
        """Drain and stop `model_id`; returns "unloaded" or "not running"."""
        lc = self.reg.lifecycle
        entry = self._known(model_id)
        async with self._lock(entry.id):
            slot = await lc.wait_settled(lc.slot_for(entry))
            return "unloaded" if await lc.unload_slot(slot, "admin unload") else "not running"

    async def drain(self, model_id: str) -> str:
        """Take `model_id` out of service until the next load or reload.

        Returns "drained" when a worker was drained and stopped, "not running" otherwise
        (the model is held out of service either way).
        """
        lc = self.reg.lifecycle
        entry = self._known(model_id)
        async with self._lock(entry.id):
            slot = lc.slot_for(entry)
            lc.set_drained(slot, True)  # from here on, acquire answers 503
            stopped = await lc.unload_slot(await lc.wait_settled(slot), "admin drain")
            return "drained" if stopped else "not running"

    async def reload(self, model_id: str) -> str:
        """Hot-swap `model_id`'s worker; returns "reloaded", "reloaded cold" or "loaded"."""
        lc = self.reg.lifecycle
        entry = self.reg.catalog.resolve(model_id)
        async with self._lock(entry.id):
            slot = lc.slot_for(entry)
            lc.set_drained(slot, False)
            slot = await lc.wait_settled(slot)
            lc.reset(slot)  # FATAL or BACKOFF -> STOPPED: the operator's reset
            if slot.state is State.STOPPED:
                await self._start(entry)
                return "loaded"
            # The folder may have changed (that is often the point): rediscover it.
            fresh = self.reg.catalog.entries().get(slot.id, slot.entry)
            new = lc.new_slot(fresh, slot.generation + 1)
            if not _fits_beside(lc, slot, new):
                await lc.unload_slot(slot, "cold reload")
                await self._start(entry)
                lc.counters.reloads += 1
                return "reloaded cold"
            await hot_swap(lc, slot, new)
            lc.counters.reloads += 1
            return "reloaded"

    async def retire(self, model_id: str, then: Callable[[], Awaitable[None]]) -> bool:
        """Stop `model_id` for good while `then()` deletes or replaces its folder: drained
        (requests get 503 meanwhile) and stopped first, dropped from routing after, so the
        next request finds the new folder or none. True if a worker was running."""
        lc = self.reg.lifecycle
        async with self._lock(model_id):
            slot = lc.slots.get(model_id)
            if slot is None:
                await then()
                return False
            held, why = slot.drained, slot.drained_why  # an operator's drain outlives a failure
            lc.set_drained(slot, True, "is being deleted or replaced")
            try:
                stopped = await lc.unload_slot(await lc.wait_settled(slot), "delete")
                lc.reset(slot)  # FATAL or BACKOFF -> STOPPED: nothing restarts it
                await then()
            except BaseException:
                lc.set_drained(slot, held, why)
                raise
            lc.forget(await lc.wait_settled(slot))
            return stopped


def _fits_beside(lc: Lifecycle, old: ModelSlot, new: ModelSlot) -> bool:
    """Can `new` start while `old` (same model) keeps serving?"""
    try:
        return (
            plan_eviction(
                residents(lc, old.id),
                new.footprint_bytes,
                lc.budget_bytes,
                lc.settings.max_loaded_models,
            )
            is not None
        )
    except DoesNotFit:
        return False
