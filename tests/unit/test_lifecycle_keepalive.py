"""Keep-alive over fake workers and a fake clock: idle models unload on time, busy and pinned
ones never, keep_alive 0 at once, -1 never."""

from __future__ import annotations

import asyncio

from fake_workers import FakeClock, Fleet, make_registry, settled, until

from mlxd.supervisor.lifecycle.states import State
from mlxd.supervisor.scheduling import keepalive


def test_an_idle_model_unloads_when_its_keep_alive_runs_out(tmp_path):
    fleet, clock = Fleet(load_s=0), FakeClock()

    async def go():
        reg = make_registry(tmp_path, fleet, "m", clock=clock, keep_alive_s=30)
        lc = reg.lifecycle
        reg.leases.release(await reg.leases.acquire(reg.catalog.resolve("m")))
        slot = lc.slots["m"]
        clock.advance(29.9)
        assert keepalive.expired(lc, clock()) == []
        keepalive.sweep(lc)
        await asyncio.sleep(0.01)
        assert slot.state is State.READY
        clock.advance(0.1)  # 30 s since the last lease ended
        assert keepalive.expired(lc, clock()) == [slot]
        keepalive.sweep(lc)
        await settled(slot, State.STOPPED)
        assert fleet.drained == fleet.spawned  # drained before it was stopped
        # The unload counts once its stop has been seen: a step after the state changes.
        await until(lambda: lc.counters.unloads == 1)
        assert lc.counters.crashes == 0
        await reg.shutdown()

    asyncio.run(go())


def test_the_timer_starts_when_the_last_lease_ends(tmp_path):
    fleet, clock = Fleet(load_s=0), FakeClock()

    async def go():
        reg = make_registry(tmp_path, fleet, "m", clock=clock, keep_alive_s=10)
        lc = reg.lifecycle
        held = await reg.leases.acquire(reg.catalog.resolve("m"))
        clock.advance(60)  # a long response: busy models never expire
        assert keepalive.expired(lc, clock()) == []
        reg.leases.release(held)
        clock.advance(9)
        assert keepalive.expired(lc, clock()) == []
        clock.advance(1)
        assert keepalive.expired(lc, clock()) == [held]
        await reg.shutdown()

    asyncio.run(go())


def test_keep_alive_zero_unloads_as_soon_as_idle(tmp_path):
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(tmp_path, fleet, "m", keep_alive_s=0)
        first = await reg.leases.acquire(reg.catalog.resolve("m"))
        second = await reg.leases.acquire(reg.catalog.resolve("m"))
        reg.leases.release(first)
        await asyncio.sleep(0.02)
        assert second.state is State.READY  # one lease is still held
        reg.leases.release(second)
        await settled(second, State.STOPPED)
        assert fleet.spawned[0].returncode == 0
        await reg.shutdown()

    asyncio.run(go())


def test_pinned_models_and_keep_alive_minus_one_are_never_unloaded(tmp_path):
    fleet, clock = Fleet(load_s=0), FakeClock()

    async def go():
        reg = make_registry(
            tmp_path,
            fleet,
            "pinned",
            "forever",
            clock=clock,
            keep_alive_s=5,
            models={"pinned": {"pinned": True}, "forever": {"keep_alive_s": -1}},
        )
        lc = reg.lifecycle
        for model in ("pinned", "forever"):
            reg.leases.release(await reg.leases.acquire(reg.catalog.resolve(model)))
        clock.advance(10**6)
        assert keepalive.expired(lc, clock()) == []
        keepalive.sweep(lc)
        await asyncio.sleep(0.02)
        assert lc.slots["pinned"].state is lc.slots["forever"].state is State.READY
        await reg.shutdown()

    asyncio.run(go())


def test_a_pinned_model_with_keep_alive_zero_stays(tmp_path):
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(tmp_path, fleet, "m", keep_alive_s=0, models={"m": {"pinned": True}})
        slot = await reg.leases.acquire(reg.catalog.resolve("m"))
        reg.leases.release(slot)
        await asyncio.sleep(0.02)
        assert slot.state is State.READY
        await reg.shutdown()

    asyncio.run(go())


def test_a_model_keeps_its_own_keep_alive(tmp_path):
    fleet, clock = Fleet(load_s=0), FakeClock()

    async def go():
        reg = make_registry(
            tmp_path,
            fleet,
            "short",
            "long",
            clock=clock,
            keep_alive_s=100,
            models={"short": {"keep_alive_s": 1}},
        )
        lc = reg.lifecycle
        for model in ("short", "long"):
            reg.leases.release(await reg.leases.acquire(reg.catalog.resolve(model)))
        clock.advance(1)
        assert keepalive.expired(lc, clock()) == [lc.slots["short"]]
        await reg.shutdown()

    asyncio.run(go())


def test_the_keep_alive_loop_unloads_on_its_own(tmp_path):
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(tmp_path, fleet, "m", keep_alive_s=0.05)
        loop = asyncio.create_task(keepalive.run_keepalive(reg.lifecycle, tick_s=0.01))
        slot = await reg.leases.acquire(reg.catalog.resolve("m"))
        reg.leases.release(slot)
        await settled(slot, State.STOPPED, timeout_s=2)
        loop.cancel()
        await reg.shutdown()

    asyncio.run(go())


def test_a_keep_alive_that_unloads_sooner_needs_the_right_to_shorten():
    grant = keepalive.granted_keep_alive
    # Not an admin caller: what would unload sooner than the configured 300 s is ignored.
    assert [grant(ask, 300.0, False) for ask in (0.0, -0.0, 1.0, 299.0)] == [None] * 4
    assert [grant(ask, 300.0, False) for ask in (None, 300.0, 3600.0, -1.0)] == [
        None,
        300.0,
        3600.0,
        -1.0,
    ]
    assert grant(3600.0, -1.0, False) is None  # configured "never": any timer is sooner
    assert grant(0.0, 0.0, False) == 0.0  # it unloads at once anyway
    # An admin caller (or api_keep_alive_unloads) gets what it asked for.
    assert [grant(ask, 300.0, True) for ask in (0.0, 1.0, None, -1.0)] == [0.0, 1.0, None, -1.0]
