"""Operator verbs over fake workers: a drain holds a model out of service until a load or
reload; reload swaps generations hot when both fit, cold when not, and resets FATAL."""

from __future__ import annotations

import asyncio
import logging

import pytest
from fake_workers import Fleet, make_registry, until

from mlxd.shared.errors import Unavailable
from mlxd.shared.exit_codes import EXIT_MODEL_LOAD_ERROR
from mlxd.supervisor.lifecycle.states import State
from mlxd.supervisor.registry.operations import ModelOps


async def serve(reg, model: str = "m"):
    """Take and end one lease (the model is READY afterwards)."""
    slot = await asyncio.wait_for(reg.leases.acquire(reg.catalog.resolve(model)), 5)
    reg.leases.release(slot)
    return slot


def test_an_operator_drain_blocks_leases_until_load_or_reload(tmp_path):
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(tmp_path, fleet, "m")
        ops = ModelOps(reg)
        await serve(reg)
        assert await ops.drain("m") == "drained"
        assert reg.lifecycle.slots["m"].state is State.STOPPED and fleet.drained
        with pytest.raises(Unavailable, match="drained by an operator"):
            await reg.leases.acquire(reg.catalog.resolve("m"))
        assert await ops.load("m") == "loaded"
        await serve(reg)
        assert await ops.drain("m") == "drained"
        assert await ops.drain("m") == "not running"  # still held out of service
        with pytest.raises(Unavailable, match="drained by an operator"):
            await reg.leases.acquire(reg.catalog.resolve("m"))
        assert await ops.reload("m") == "loaded"
        assert (await serve(reg)).state is State.READY
        await reg.shutdown()

    asyncio.run(go())


def test_a_drain_lets_the_request_in_flight_finish(tmp_path):
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(tmp_path, fleet, "m")
        ops = ModelOps(reg)
        held = await reg.leases.acquire(reg.catalog.resolve("m"))
        drain = asyncio.create_task(ops.drain("m"))
        await asyncio.sleep(0.05)
        assert held.state is State.DRAINING and fleet.spawned[0].returncode is None
        reg.leases.release(held)
        assert await asyncio.wait_for(drain, 5) == "drained"

    asyncio.run(go())


def test_reload_swaps_generations_hot_when_both_fit(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mlxd")
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(tmp_path, fleet, "m")
        lc, ops = reg.lifecycle, ModelOps(reg)
        old = await serve(reg)
        assert await ops.reload("m") == "reloaded"
        new = lc.slots["m"]
        assert new is not old and new.generation == 1 and new.state is State.READY
        assert old.state is State.STOPPED and not lc.incoming and not lc.retired
        assert [w.generation for w in fleet.spawned] == [0, 1]
        assert new.socket != old.socket and lc.counters.reloads == 1
        assert (await serve(reg)) is new
        await reg.shutdown()

    asyncio.run(go())
    assert "hot swap: generation 1 is serving, draining generation 0" in caplog.text


def test_reload_is_cold_when_both_copies_do_not_fit(tmp_path):
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(tmp_path, fleet, "m", memory_budget_bytes=1500)
        lc, ops = reg.lifecycle, ModelOps(reg)
        slot = await serve(reg)
        assert await ops.reload("m") == "reloaded cold"
        assert lc.slots["m"] is slot and slot.state is State.READY
        assert len(fleet.spawned) == 2 and fleet.spawned[0].returncode == 0
        assert lc.counters.reloads == 1
        await reg.shutdown()

    asyncio.run(go())


def test_reload_resets_a_fatal_model(tmp_path):
    fleet = Fleet(load_s=0)
    fleet.exit_on_start = EXIT_MODEL_LOAD_ERROR

    async def go():
        reg = make_registry(tmp_path, fleet, "m")
        ops = ModelOps(reg)
        with pytest.raises(Unavailable):
            await reg.leases.acquire(reg.catalog.resolve("m"))
        slot = reg.lifecycle.slots["m"]
        await until(lambda: reg.lifecycle.load_task("m").done())  # its failure is told
        assert slot.state is State.FATAL and slot.crashes
        fleet.exit_on_start = None  # the operator fixed the model folder
        assert await ops.reload("m") == "loaded"
        assert slot.state is State.READY and not slot.crashes and slot.restarts == 0
        await reg.shutdown()

    asyncio.run(go())


def test_unload_of_a_stopped_model_is_not_running(tmp_path):
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(tmp_path, fleet, "m")
        ops = ModelOps(reg)
        assert await ops.unload("m") == "not running"
        await serve(reg)
        assert await ops.unload("m") == "unloaded"
        assert reg.lifecycle.counters.unloads == 1
        assert (await serve(reg)).state is State.READY  # an unload is no drain
        await reg.shutdown()

    asyncio.run(go())


def test_a_request_for_a_model_being_deleted_is_told_so(tmp_path):
    """A probe (2026-12-07): a request that arrived while /api/delete retired its model was
    told the model "was drained by an operator; load or reload it" (it cannot be loaded)."""
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(tmp_path, fleet, "m")
        ops = ModelOps(reg)
        await serve(reg)
        told: list[str] = []

        async def remove() -> None:  # the folder's removal, while the model is held out
            with pytest.raises(Unavailable) as err:
                await reg.leases.acquire(reg.catalog.resolve("m"))
            told.append(err.value.message)

        assert await ops.retire("m", remove) is True
        assert told and "is being deleted or replaced" in told[0] and "reload" not in told[0]

    asyncio.run(go())
