"""The budget follows what workers report: a READY worker counts at its /health
`memory_in_use_bytes` (refreshed by the watchdog), a model not yet READY at its estimate."""

from __future__ import annotations

import asyncio

from fake_workers import FakeClock, Fleet, make_models, make_registry

from mlxd.shared.wire.memory import ModelMemory
from mlxd.supervisor.lifecycle.admission import share_bytes
from mlxd.supervisor.lifecycle.states import State
from mlxd.supervisor.lifecycle.watchdog import check_health


async def use(reg, clock, model: str):
    clock.advance(1)
    slot = await asyncio.wait_for(reg.leases.acquire(reg.catalog.resolve(model)), 5)
    reg.leases.release(slot)
    return slot


def states(reg) -> dict[str, State]:
    return {m: s.state for m, s in reg.lifecycle.slots.items()}


def test_a_worker_holding_more_than_its_estimate_is_evicted_for_the_next_model(tmp_path):
    fleet, clock = Fleet(load_s=0), FakeClock()
    fleet.memory = {"a": 2000}  # estimates are 1000 each; a's worker holds twice that

    async def go():
        reg = make_registry(tmp_path, fleet, "a", "b", clock=clock, memory_budget_bytes=2500)
        a = await use(reg, clock, "a")
        assert a.footprint_bytes == 2000
        await use(reg, clock, "b")  # by the estimates both fit; by a's report they do not
        assert states(reg) == {"a": State.STOPPED, "b": State.READY}
        assert reg.lifecycle.counters.evictions == 1
        assert a.footprint_bytes == 1000  # stopped: back to the estimate
        await reg.shutdown()

    asyncio.run(go())


def test_workers_holding_less_than_their_estimate_leave_room_for_more(tmp_path):
    fleet, clock = Fleet(load_s=0), FakeClock()
    fleet.memory = {"a": 500, "b": 500, "c": 500}

    async def go():
        reg = make_registry(tmp_path, fleet, "a", "b", "c", clock=clock, memory_budget_bytes=2500)
        for m in ("a", "b", "c"):  # estimates would evict a for c; the reports fit all three
            await use(reg, clock, m)
        assert set(states(reg).values()) == {State.READY}
        assert reg.lifecycle.counters.evictions == 0
        await reg.shutdown()

    asyncio.run(go())


def test_the_watchdog_refreshes_the_footprint_and_eviction_follows_it(tmp_path):
    fleet, clock = Fleet(load_s=0), FakeClock()
    fleet.memory = {"a": 500, "b": 500}

    async def go():
        reg = make_registry(tmp_path, fleet, "a", "b", "c", clock=clock, memory_budget_bytes=2500)
        a = await use(reg, clock, "a")
        await use(reg, clock, "b")
        # As reported at READY, c (estimate 1000) would fit beside them: 500 + 500 + 1000.
        fleet.spawned[0].memory_bytes = 1800  # a's rows and prompt cache grew
        await check_health(reg.lifecycle, a)
        assert a.footprint_bytes == 1800
        await use(reg, clock, "c")
        assert states(reg) == {"a": State.STOPPED, "b": State.READY, "c": State.READY}
        assert reg.lifecycle.counters.evictions == 1
        await reg.shutdown()

    asyncio.run(go())


def test_each_worker_is_given_the_budget_less_what_the_others_report(tmp_path):
    fleet, clock = Fleet(load_s=0), FakeClock()
    fleet.memory = {"a": 600, "b": 2000}

    async def go():
        reg = make_registry(tmp_path, fleet, "a", "b", "c", clock=clock, memory_budget_bytes=4000)
        for m in ("a", "b", "c"):
            await use(reg, clock, m)
        a, b, c = fleet.spawned
        assert a.memory_limit_bytes == 4000  # alone: the whole budget
        assert b.memory_limit_bytes == 4000 - 600
        # 4000 - 600 - 2000 = 1400 left for c
        assert c.memory_limit_bytes == 1400
        await reg.shutdown()

    asyncio.run(go())


def test_the_share_is_never_below_the_models_estimate(tmp_path):
    fleet, clock = Fleet(load_s=0), FakeClock()
    fleet.memory = {"a": 600}

    async def go():
        reg = make_registry(tmp_path, fleet, "a", "b", clock=clock, memory_budget_bytes=3500)
        a = await use(reg, clock, "a")
        b = reg.lifecycle.slot_for(reg.catalog.resolve("b"))
        assert share_bytes(reg.lifecycle, b) == 3500 - 600
        a.reported = ModelMemory(
            weights_bytes=3000, kv_reserved_bytes=400
        )  # a's rows grew: 100 bytes left, less than b's estimate
        assert share_bytes(reg.lifecycle, b) == b.estimate_bytes == 1000
        await reg.shutdown()

    asyncio.run(go())


def test_a_draft_models_weights_count_in_the_estimate(tmp_path):
    """speculative = "draft" loads a second model in the worker: the budget counts it before
    the worker reports, so two models that fit alone no longer fit with a draft beside one."""
    make_models(tmp_path, "small", weights_bytes=600)
    fleet, clock = Fleet(load_s=0), FakeClock()
    draft = {"speculative": "draft", "draft_model": str(tmp_path / "models" / "small")}

    async def go():
        reg = make_registry(
            tmp_path, fleet, "a", "b", clock=clock, memory_budget_bytes=2500, models={"a": draft}
        )
        assert reg.lifecycle.slot_for(reg.catalog.resolve("a")).estimate_bytes == 1600
        await use(reg, clock, "a")
        await use(reg, clock, "b")  # 1600 + 1000 > 2500: a goes
        assert states(reg)["a"] is State.STOPPED and states(reg)["b"] is State.READY
        await reg.shutdown()

    asyncio.run(go())
