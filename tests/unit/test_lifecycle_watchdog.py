"""The health watchdog over fake workers and a fake clock: a worker that stops answering
/health is killed after watchdog_timeout_s (not before), and its exit counts as a crash."""

from __future__ import annotations

import asyncio
import logging

from fake_workers import FakeClock, Fleet, make_registry, settled

from mlxd.supervisor.lifecycle.states import State
from mlxd.supervisor.lifecycle.watchdog import check_health, run_watchdog


def test_a_silent_worker_is_killed_after_the_watchdog_timeout(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mlxd")
    fleet, clock = Fleet(load_s=0), FakeClock()

    async def go():
        reg = make_registry(
            tmp_path, fleet, "m", clock=clock, health_interval_s=5, watchdog_timeout_s=30
        )
        lc = reg.lifecycle
        slot = await reg.leases.acquire(reg.catalog.resolve("m"))
        reg.leases.release(slot)
        worker = fleet.spawned[0]
        clock.advance(20)
        await check_health(lc, slot)  # it answers: the silence starts counting from here
        assert slot.last_health_ok == clock()
        worker.silent = True
        clock.advance(29)
        await check_health(lc, slot)
        assert worker.returncode is None and slot.state is State.READY
        clock.advance(1)
        await check_health(lc, slot)
        assert worker.returncode == -9
        await settled(slot, State.BACKOFF)
        assert len(slot.crashes) == 1 and lc.counters.crashes == 1
        again = await asyncio.wait_for(reg.leases.acquire(reg.catalog.resolve("m")), 5)
        assert again.process is fleet.spawned[1]
        reg.leases.release(again)
        await reg.shutdown()

    asyncio.run(go())
    # One line for the kill, written with the exit: why, and how the worker ended.
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) == 1, loud
    assert "watchdog: model=m silent for 30s; restarting it (exit code -9" in loud[0]
    assert sum("silent for" in r.getMessage() for r in caplog.records) == 1


def test_the_watchdog_loop_probes_every_ready_worker(tmp_path):
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(
            tmp_path, fleet, "a", "b", health_interval_s=0.02, watchdog_timeout_s=0.1
        )
        lc = reg.lifecycle
        for model in ("a", "b"):
            reg.leases.release(await reg.leases.acquire(reg.catalog.resolve(model)))
        loop = asyncio.create_task(run_watchdog(lc, tick_s=0.01))
        fleet.spawned[0].silent = True  # a hangs; b keeps answering
        await settled(lc.slots["a"], State.BACKOFF, timeout_s=3)
        assert fleet.spawned[1].returncode is None and lc.slots["b"].state is State.READY
        loop.cancel()
        await reg.shutdown()

    asyncio.run(go())


def test_a_worker_that_the_watchdog_probes_while_busy_is_left_alone(tmp_path):
    """A slot the supervisor moved meanwhile (its own unload) is not the watchdog's fault."""
    fleet, clock = Fleet(load_s=0), FakeClock()

    async def go():
        reg = make_registry(tmp_path, fleet, "m", clock=clock, watchdog_timeout_s=1)
        lc = reg.lifecycle
        slot = await reg.leases.acquire(reg.catalog.resolve("m"))
        fleet.spawned[0].silent = True
        clock.advance(5)
        unload = asyncio.create_task(lc.unload_slot(slot, "admin unload"))
        await settled(slot, State.DRAINING)
        await check_health(lc, slot)
        assert fleet.spawned[0].returncode is None  # not killed: it is being drained
        reg.leases.release(slot)
        assert await asyncio.wait_for(unload, 5)
        assert lc.counters.crashes == 0
        await reg.shutdown()

    asyncio.run(go())
