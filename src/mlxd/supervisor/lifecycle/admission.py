"""Fair room under the memory budget: first come, first served across competing models.

Without this, two busy models that cannot both fit livelock: one becomes READY and is evicted
for the other before its waiting requests take a lease, and a busy model that keeps taking
new requests starves a model waiting for room. Three rules stop that:

- Hand-over: requests waiting for a model's start count as its leases (`slot.handover`), so
  a model that just became READY serves them before it can be evicted.
- Closing: a load that must wait for busy models marks the ones it will evict with a cutoff,
  the arrival time of its oldest waiting request. Those models keep serving requests that
  arrived before the cutoff; later ones wait behind the load (they are `held`). When the
  older leases end the models are evicted and the load goes ahead.
- Residency: a model READY for less than `min_residency_s` is neither evicted nor closed.

Loads themselves start one at a time in arrival order (the lifecycle owner's load gate).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING

from mlxd.shared.errors import Unavailable
from mlxd.supervisor.lifecycle.slot import ModelSlot
from mlxd.supervisor.lifecycle.states import RUNNING, State
from mlxd.supervisor.policy.eviction import DoesNotFit, Resident, plan_eviction

if TYPE_CHECKING:
    from mlxd.supervisor.lifecycle.owner import Lifecycle

_REPLAN_S = 1.0  # a load waiting for room looks again at least this often


class Admission:
    """The closing marks: which READY models admit only requests older than a cutoff."""

    def __init__(self):
        self._closing: dict[ModelSlot, dict[ModelSlot, float]] = {}  # load -> victim -> cutoff
        self.changed = asyncio.Event()

    def cutoff(self, slot: ModelSlot) -> float | None:
        """Requests for `slot` that arrived at or after this wait their turn (None: no mark)."""
        cuts = [marks[slot] for marks in self._closing.values() if slot in marks]
        return min(cuts) if cuts else None

    def admits(self, slot: ModelSlot, arrived: float) -> bool:
        cutoff = self.cutoff(slot)
        return cutoff is None or arrived < cutoff

    def close(self, owner: ModelSlot, victims: dict[ModelSlot, float]) -> None:
        """Set the marks `owner` (a load waiting for room) holds on the models it waits for."""
        if self._closing.get(owner, {}) != victims:
            self._closing[owner] = victims
            self._signal()

    def reopen(self, owner: ModelSlot) -> None:
        """Drop `owner`'s marks (its load got room, failed, or lost its last waiter)."""
        if self._closing.pop(owner, None):
            self._signal()

    def _signal(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()


async def wait_any(
    events: list[asyncio.Event], task: asyncio.Task | None, timeout_s: float
) -> None:
    """Wait until one of `events` is set, `task` is done, or `timeout_s` passed."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(
            [*waiters, *([task] if task else [])],
            timeout=timeout_s,
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        for w in waiters:
            w.cancel()


def residents(lc: Lifecycle, model_id: str, skip: ModelSlot | None = None) -> list[Resident]:
    """The running workers as the eviction policy sees them, to make room for `model_id`."""
    now = lc.clock()
    min_res_s = lc.settings.min_residency_s
    return [
        Resident(
            s.id,
            s.footprint_bytes,
            s.leases + s.handover,
            s.last_used,
            s.settings.pinned,
            evictable=(
                s.state is State.READY and s.id != model_id and now - s.ready_at >= min_res_s
            ),
        )
        for s in [*lc.slots.values(), *lc.incoming, *lc.retired]
        if s is not skip and s.state in RUNNING
    ]


def share_bytes(lc: Lifecycle, slot: ModelSlot) -> int:
    """The memory `slot`'s worker may plan within (WorkerSpec.memory_limit_bytes): the budget
    less what the other running workers hold (their reports, else estimates), never less
    than the model's own estimate (make_room found that much room for it)."""
    others = sum(r.footprint_bytes for r in residents(lc, "", skip=slot))
    return max(slot.estimate_bytes, lc.budget_bytes - others)


async def make_room(lc: Lifecycle, slot: ModelSlot) -> None:
    """Evict idle models until `slot` fits; wait (fairly) while busy ones stand in the way."""
    give_up_at = lc.clock() + lc.settings.queue_timeout_s  # for a hot reload's load
    try:
        while True:
            res = residents(lc, slot.id, skip=slot)
            try:
                victims = plan_eviction(
                    res, slot.footprint_bytes, lc.budget_bytes, lc.settings.max_loaded_models
                )
            except DoesNotFit as exc:
                lc.counters.load_failures += 1
                raise Unavailable(f"Model '{slot.id}' does not fit in memory: {exc}") from None
            if victims == []:
                return
            if victims:
                done = await asyncio.gather(
                    *(
                        lc.unload(v, reason=f"evicted for {slot.id}", only_if_idle=True)
                        for v in victims
                    )
                )
                lc.counters.evictions += sum(done)  # not those a request took meanwhile
                continue
            lc.admission.close(slot, _closing_marks(lc, slot, res))
            if slot in lc.incoming:
                if lc.clock() >= give_up_at:
                    raise Unavailable(
                        f"No room to load '{slot.id}': every loaded model stayed busy",
                        retry_after_s=lc.retry_after_s(),
                    )
            elif slot.handover == 0:
                # Every request that wanted this model timed out or left: stop closing others.
                raise Unavailable(f"Load of '{slot.id}' abandoned: nobody waits for it")
            await _wait_for_room(lc)
    finally:
        lc.admission.reopen(slot)


def _closing_marks(lc: Lifecycle, slot: ModelSlot, res: list[Resident]) -> dict:
    """The models this load would evict were they idle, each with the load's cutoff."""
    idle = [dataclasses.replace(r, leases=0) for r in res]
    ids = (
        plan_eviction(idle, slot.footprint_bytes, lc.budget_bytes, lc.settings.max_loaded_models)
        or []
    )
    cutoff = min(slot.wait_since.values(), default=lc.clock())
    return {lc.slots[i]: cutoff for i in ids if i in lc.slots}


async def _wait_for_room(lc: Lifecycle) -> None:
    """Until a lease ends or a worker exits, a residency ends, or _REPLAN_S passed."""
    now, min_res_s = lc.clock(), lc.settings.min_residency_s
    young = [
        s.ready_at + min_res_s - now
        for s in lc.slots.values()
        if s.state is State.READY and now - s.ready_at < min_res_s
    ]
    timeout_s = max(0.01, min([_REPLAN_S, *young]))
    room = lc.room
    try:
        await asyncio.wait_for(room.wait(), timeout_s)
    except asyncio.TimeoutError:
        pass
