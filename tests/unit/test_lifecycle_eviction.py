"""Eviction over fake workers: a load takes the idle least recently used model, never a busy
one; a model larger than the budget is refused with the numbers."""

from __future__ import annotations

import asyncio

import pytest
from fake_workers import FakeClock, Fleet, make_registry

from mlxd.shared.errors import Unavailable
from mlxd.supervisor.lifecycle.states import State


def test_a_load_evicts_the_idle_least_recently_used_model(tmp_path):
    fleet, clock = Fleet(load_s=0), FakeClock()

    async def go():
        # Footprints are 1000 bytes each: the budget holds two models.
        reg = make_registry(tmp_path, fleet, "a", "b", "c", clock=clock, memory_budget_bytes=2500)
        lc = reg.lifecycle
        for model in ("a", "b"):
            clock.advance(1)
            reg.leases.release(await reg.leases.acquire(reg.catalog.resolve(model)))
        clock.advance(1)
        reg.leases.release(await reg.leases.acquire(reg.catalog.resolve("c")))
        states = {m: s.state for m, s in lc.slots.items()}
        assert states == {"a": State.STOPPED, "b": State.READY, "c": State.READY}
        assert lc.counters.evictions == 1 and fleet.drained == [fleet.spawned[0]]
        await reg.shutdown()

    asyncio.run(go())


def test_a_busy_model_is_never_evicted_even_when_it_is_the_oldest(tmp_path):
    fleet, clock = Fleet(load_s=0), FakeClock()

    async def go():
        reg = make_registry(tmp_path, fleet, "a", "b", "c", clock=clock, memory_budget_bytes=2500)
        lc = reg.lifecycle
        clock.advance(1)
        busy = await reg.leases.acquire(reg.catalog.resolve("b"))  # held: used longest ago
        clock.advance(1)
        reg.leases.release(await reg.leases.acquire(reg.catalog.resolve("c")))
        clock.advance(1)
        a = await asyncio.wait_for(reg.leases.acquire(reg.catalog.resolve("a")), 5)
        assert busy.state is State.READY and lc.slots["c"].state is State.STOPPED
        assert a.state is State.READY
        reg.leases.release(a)
        reg.leases.release(busy)
        await reg.shutdown()

    asyncio.run(go())


def test_pinned_models_are_never_evicted(tmp_path):
    fleet, clock = Fleet(load_s=0), FakeClock()

    async def go():
        reg = make_registry(
            tmp_path,
            fleet,
            "pin",
            "a",
            "b",
            clock=clock,
            memory_budget_bytes=2500,
            models={"pin": {"pinned": True}},
        )
        lc = reg.lifecycle
        for model in ("pin", "a", "b"):  # pin is the least recently used
            clock.advance(1)
            reg.leases.release(await reg.leases.acquire(reg.catalog.resolve(model)))
        assert lc.slots["pin"].state is State.READY and lc.slots["a"].state is State.STOPPED
        await reg.shutdown()

    asyncio.run(go())


def test_max_loaded_models_evicts_by_count(tmp_path):
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(tmp_path, fleet, "a", "b", max_loaded_models=1)
        reg.leases.release(await reg.leases.acquire(reg.catalog.resolve("a")))
        reg.leases.release(await reg.leases.acquire(reg.catalog.resolve("b")))
        assert reg.lifecycle.slots["a"].state is State.STOPPED
        await reg.shutdown()

    asyncio.run(go())


def test_a_model_larger_than_the_budget_is_refused_with_the_numbers(tmp_path):
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(tmp_path, fleet, "m", memory_budget_bytes=500)
        want = "does not fit in memory: needs 1000 B, 500 B free of a 500 B budget"
        with pytest.raises(Unavailable, match=want):
            await reg.leases.acquire(reg.catalog.resolve("m"))
        assert reg.lifecycle.counters.load_failures == 1 and fleet.spawned == []
        await reg.shutdown()

    asyncio.run(go())
