"""Shutdown over fake workers: a worker still loading, draining or backing off is stopped
cleanly (never a crash, never BACKOFF), READY ones are drained first, and nothing starts
after it."""

from __future__ import annotations

import asyncio
import logging

import pytest
from fake_workers import Fleet, make_registry, settled, until

from mlxd.shared.errors import Unavailable
from mlxd.supervisor.lifecycle.states import State


def test_shutdown_during_a_load_is_a_clean_stop_not_a_crash(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mlxd")
    fleet = Fleet(load_s=60)  # never healthy before the shutdown

    async def go():
        reg = make_registry(tmp_path, fleet, "m")
        lc = reg.lifecycle
        waiter = asyncio.create_task(reg.leases.acquire(reg.catalog.resolve("m")))
        await until(lambda: "m" in lc.slots and lc.slots["m"].state is State.STARTING)
        slot = lc.slots["m"]
        await asyncio.wait_for(reg.shutdown(), 5)
        assert slot.state is State.STOPPED and slot.process is None
        assert fleet.terminated == fleet.spawned  # SIGTERM, not a kill
        assert not slot.crashes and slot.restarts == 0 and lc.counters.crashes == 0
        with pytest.raises(Unavailable, match="shutting down"):
            await asyncio.wait_for(waiter, 5)
        assert len(fleet.spawned) == 1  # the waiter did not start it again

    asyncio.run(go())
    assert "from=starting to=stopping (shutdown)" in caplog.text
    assert "worker died" not in caplog.text and "to=backoff" not in caplog.text


def test_shutdown_drains_ready_workers_and_stops_a_backoff_for_good(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mlxd")
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(tmp_path, fleet, "ready", "crashed", backoff_initial_s=60)
        lc = reg.lifecycle
        for model in ("ready", "crashed"):
            reg.leases.release(await reg.leases.acquire(reg.catalog.resolve(model)))
        fleet.spawned[1].crash(1)
        await settled(lc.slots["crashed"], State.BACKOFF)
        await asyncio.wait_for(reg.shutdown(), 5)
        assert lc.slots["ready"].state is State.STOPPED
        assert fleet.drained == [fleet.spawned[0]]  # drained (cache persisted), then stopped
        assert lc.slots["crashed"].state is State.STOPPED  # no restart after the backoff
        assert lc.counters.crashes == 1 and len(fleet.spawned) == 2
        assert not list((tmp_path / "run").glob("*.sock"))

    asyncio.run(go())
    assert "model=crashed from=backoff to=stopped (shutdown)" in caplog.text


def test_shutdown_takes_over_a_drain_in_progress_without_a_crash(tmp_path):
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(tmp_path, fleet, "m", drain_timeout_s=30)
        lc = reg.lifecycle
        slot = await reg.leases.acquire(reg.catalog.resolve("m"))  # held through the unload
        unload = asyncio.create_task(lc.unload_slot(slot, "admin unload"))
        await settled(slot, State.DRAINING)
        await asyncio.wait_for(reg.shutdown(), 5)
        assert slot.state is State.STOPPED and lc.counters.crashes == 0
        assert await asyncio.wait_for(unload, 5) is False  # the shutdown stopped it
        reg.leases.release(slot)

    asyncio.run(go())


def test_no_load_starts_after_shutdown(tmp_path):
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(tmp_path, fleet, "m")
        await reg.shutdown()
        with pytest.raises(Unavailable, match="shutting down"):
            await reg.leases.acquire(reg.catalog.resolve("m"))
        assert fleet.spawned == []

    asyncio.run(go())
