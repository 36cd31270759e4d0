"""Crashes over fake workers: BACKOFF with a doubling delay, FATAL after crash_limit, FATAL at
once for exit codes that say restarting will not help, and the crash window."""

from __future__ import annotations

import asyncio
import logging

import pytest
from fake_workers import FakeClock, Fleet, make_registry, settled

from mlxd.shared.config_load import load_settings
from mlxd.shared.errors import Unavailable
from mlxd.shared.exit_codes import EXIT_CRASH, EXIT_MODEL_LOAD_ERROR, EXIT_USAGE
from mlxd.supervisor.lifecycle.crashes import judge_crash
from mlxd.supervisor.lifecycle.states import State

POLICY = load_settings(
    {"backoff_initial_s": 1, "backoff_max_s": 10, "crash_limit": 5, "crash_window_s": 60}
)


def test_backoff_doubles_up_to_its_cap_then_fatal():
    crashes: list[float] = []
    delays = []
    for t in range(5):
        crashes.append(float(t))
        verdict = judge_crash(crashes, float(t), EXIT_CRASH, POLICY)
        delays.append(None if verdict.fatal else verdict.delay_s)
    assert delays == [1, 2, 4, 8, None]  # the fifth crash within the window is FATAL
    capped = judge_crash(
        [0, 1, 2, 3], 3, EXIT_CRASH, POLICY.model_copy(update={"backoff_max_s": 5})
    )
    assert capped.delay_s == 5 and not capped.fatal


def test_only_crashes_inside_the_window_count():
    verdict = judge_crash([0, 1, 2, 3, 100], 100, EXIT_CRASH, POLICY)
    assert not verdict.fatal and verdict.recent == 1 and verdict.delay_s == 1


@pytest.mark.parametrize("code", [EXIT_USAGE, EXIT_MODEL_LOAD_ERROR])
def test_no_restart_exit_codes_are_fatal_at_once(code):
    verdict = judge_crash([0.0], 0.0, code, POLICY)
    assert verdict.fatal and verdict.recent == 1


def test_crash_goes_to_backoff_with_a_doubling_delay_then_fatal(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mlxd")
    fleet, clock = Fleet(load_s=0), FakeClock()

    async def go():
        reg = make_registry(
            tmp_path, fleet, "m", clock=clock, backoff_initial_s=0.01, crash_limit=3
        )
        lc, leases = reg.lifecycle, reg.leases
        delays = []
        for n in range(3):
            reg.leases.release(await leases.acquire(reg.catalog.resolve("m")))
            slot = lc.slots["m"]
            fleet.spawned[-1].crash(EXIT_CRASH)
            await settled(slot, State.BACKOFF, State.FATAL)
            if slot.state is State.BACKOFF:
                delays.append(round(slot.backoff_until - clock(), 6))
            assert len(slot.crashes) == n + 1 and lc.counters.crashes == n + 1
        assert delays == [0.01, 0.02]
        assert slot.state is State.FATAL and slot.restarts == 2
        with pytest.raises(Unavailable, match="FATAL"):
            await leases.acquire(reg.catalog.resolve("m"))
        assert len(fleet.spawned) == 3  # FATAL starts nothing
        await reg.shutdown()

    asyncio.run(go())
    assert caplog.text.count("worker died") == 3
    assert "from=ready to=backoff" in caplog.text and "from=ready to=fatal" in caplog.text


def test_a_model_that_cannot_load_is_fatal_at_once(tmp_path):
    fleet = Fleet(load_s=0)
    fleet.exit_on_start = EXIT_MODEL_LOAD_ERROR

    async def go():
        reg = make_registry(tmp_path, fleet, "m", crash_limit=5)
        with pytest.raises(Unavailable, match="exit code 3"):
            await reg.leases.acquire(reg.catalog.resolve("m"))
        slot = reg.lifecycle.slots["m"]
        await settled(slot, State.FATAL)
        assert len(slot.crashes) == 1 and slot.restarts == 0
        with pytest.raises(Unavailable, match="FATAL after repeated failures"):
            await reg.leases.acquire(reg.catalog.resolve("m"))
        assert len(fleet.spawned) == 1
        await reg.shutdown()

    asyncio.run(go())


def test_crashes_outside_the_window_are_forgotten(tmp_path):
    fleet, clock = Fleet(load_s=0), FakeClock()

    async def go():
        reg = make_registry(
            tmp_path,
            fleet,
            "m",
            clock=clock,
            backoff_initial_s=0.01,
            crash_limit=2,
            crash_window_s=60,
        )
        for _ in range(3):  # three crashes, each more than a window after the last
            reg.leases.release(await reg.leases.acquire(reg.catalog.resolve("m")))
            slot = reg.lifecycle.slots["m"]
            fleet.spawned[-1].crash(EXIT_CRASH)
            await settled(slot, State.BACKOFF, State.FATAL)
            assert slot.state is State.BACKOFF
            assert round(slot.backoff_until - clock(), 6) == 0.01  # never doubled
            clock.advance(61)
        await reg.shutdown()

    asyncio.run(go())


def test_a_request_during_the_backoff_waits_for_the_restart(tmp_path):
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(tmp_path, fleet, "m", backoff_initial_s=0.05)
        reg.leases.release(await reg.leases.acquire(reg.catalog.resolve("m")))
        fleet.spawned[0].crash(-9)
        slot = reg.lifecycle.slots["m"]
        await settled(slot, State.BACKOFF)
        again = await asyncio.wait_for(reg.leases.acquire(reg.catalog.resolve("m")), 5)
        assert again is slot and slot.state is State.READY and len(fleet.spawned) == 2
        reg.leases.release(again)
        await reg.shutdown()

    asyncio.run(go())
