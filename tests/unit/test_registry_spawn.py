"""A worker that cannot even be spawned leaves its model FATAL with the reason, not STARTING."""

from __future__ import annotations

import asyncio
import json

import pytest

from mlxd.shared.config_load import load_settings
from mlxd.shared.errors import Unavailable
from mlxd.supervisor.lifecycle.states import State
from mlxd.supervisor.lifecycle.upstream import UpstreamPool
from mlxd.supervisor.registry.registry import Registry


class Unspawnable:
    def __init__(self, model_id, argv, log_path):
        self.returncode = None

    async def spawn(self):
        raise OSError(24, "Too many open files")


def test_spawn_failure_is_fatal_with_its_reason(tmp_path):
    model = tmp_path / "models" / "m"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    settings = load_settings({"home": str(tmp_path), "discover_hf_cache": False})

    async def go():
        reg = Registry.build(
            settings, UpstreamPool(), total_memory_bytes=1 << 34, spawner=Unspawnable
        )
        with pytest.raises(Unavailable, match="Too many open files"):
            await reg.leases.acquire(reg.catalog.resolve("m"))
        slot = reg.lifecycle.slots["m"]
        assert slot.state is State.FATAL and "Too many open files" in slot.last_error
        with pytest.raises(Unavailable, match="FATAL"):
            await reg.leases.acquire(reg.catalog.resolve("m"))
        await reg.upstream.close_all()

    asyncio.run(go())


# -- worker identity and the watchdog (fake workers: tests/fake_workers.py) -----------------


def _fake_registry(tmp_path, fleet, **overrides):
    from fake_workers import make_models, settings_for

    make_models(tmp_path, "m")
    return Registry.build(
        settings_for(tmp_path, **overrides),
        fleet,
        total_memory_bytes=1 << 34,
        spawner=fleet.spawner,
    )


def test_worker_is_launched_with_its_generation_and_checked_against_it(tmp_path):
    from fake_workers import Fleet

    fleet = Fleet()

    async def go():
        reg = _fake_registry(tmp_path, fleet)
        slot = await reg.leases.acquire(reg.catalog.resolve("m"))
        reg.leases.release(slot)
        worker = fleet.spawned[0]
        assert worker.generation == slot.generation == 0 and slot.process is worker
        _, health = await fleet.health(slot.socket, 1.0)
        assert slot.identity_mismatch(health) is None
        stale = health.model_copy(update={"generation": 3})
        assert "generation=3" in slot.identity_mismatch(stale)
        other = health.model_copy(update={"pid": health.pid + 1})
        assert "expected pid=" in slot.identity_mismatch(other)
        await reg.shutdown()

    asyncio.run(go())


def test_a_socket_answered_by_another_worker_is_not_adopted(tmp_path, caplog):
    from fake_workers import Fleet

    from mlxd.shared.wire.admin import WorkerHealth

    fleet = Fleet()
    # A stale worker of another daemon answers on the path: healthy, but not ours.
    fleet.impostor = WorkerHealth(status="ok", pid=1, generation=0, model="m")

    async def go():
        reg = _fake_registry(tmp_path, fleet, load_timeout_s=0.5, queue_timeout_s=0.5)
        with pytest.raises(Unavailable, match="did not become healthy"):
            await reg.leases.acquire(reg.catalog.resolve("m"))
        assert (
            reg.lifecycle.counters.loads == 0 and reg.lifecycle.slots["m"].state is not State.READY
        )
        fleet.impostor = None  # the stale worker is gone: ours answers
        await asyncio.sleep(0.1)  # the crash backoff
        slot = await asyncio.wait_for(reg.leases.acquire(reg.catalog.resolve("m")), 5)
        assert slot.state is State.READY and slot.process is fleet.spawned[-1]
        reg.leases.release(slot)
        await reg.shutdown()

    asyncio.run(go())
    assert "socket answered by another worker" in caplog.text and "not adopting" in caplog.text


@pytest.mark.parametrize("status", ["draining", "failed"])
def test_watchdog_restarts_a_ready_worker_that_cannot_serve(tmp_path, caplog, status):
    from fake_workers import Fleet

    from mlxd.supervisor.lifecycle.watchdog import check_health

    fleet = Fleet()

    async def go():
        reg = _fake_registry(tmp_path, fleet)
        slot = await reg.leases.acquire(reg.catalog.resolve("m"))
        reg.leases.release(slot)
        first = fleet.spawned[0]
        first.status = status  # drained by someone else, or its engine died
        await check_health(reg.lifecycle, slot)
        assert first.returncode == (-9 if status == "failed" else 0)
        await asyncio.wait_for(_until_not(slot, State.DRAINING), 5)
        assert slot.state is State.BACKOFF and len(slot.crashes) == 1
        # a fresh worker
        again = await asyncio.wait_for(reg.leases.acquire(reg.catalog.resolve("m")), 5)
        assert again.process is fleet.spawned[1] and fleet.spawned[1].pid != first.pid
        reg.leases.release(again)
        await reg.shutdown()

    asyncio.run(go())
    # The restart is one line, written with the exit (no second line at the kill or stop).
    said = [r.getMessage() for r in caplog.records if f"reports {status}" in r.getMessage()]
    assert len(said) == 1, said
    assert f"watchdog: model=m the worker reports {status}; restarting it (" in said[0]
    assert not [r for r in caplog.records if "worker died" in r.getMessage()]


def test_watchdog_restarts_when_another_process_answers_the_socket(tmp_path, caplog):
    from fake_workers import Fleet

    from mlxd.shared.wire.admin import WorkerHealth
    from mlxd.supervisor.lifecycle.watchdog import check_health

    fleet = Fleet()

    async def go():
        reg = _fake_registry(tmp_path, fleet)
        slot = await reg.leases.acquire(reg.catalog.resolve("m"))
        reg.leases.release(slot)
        fleet.impostor = WorkerHealth(status="ok", pid=1, generation=7, model="m")
        await check_health(reg.lifecycle, slot)
        assert slot.state in (State.DRAINING, State.BACKOFF)
        assert fleet.spawned[0].returncode is not None
        await asyncio.wait_for(_until_not(slot, State.DRAINING), 5)
        fleet.impostor = None
        await reg.shutdown()

    asyncio.run(go())
    said = [r.getMessage() for r in caplog.records if "answered by another" in r.getMessage()]
    assert len(said) == 1 and "; restarting it (" in said[0], said


def test_watchdog_leaves_a_drain_of_the_supervisors_own_alone(tmp_path):
    from fake_workers import Fleet

    from mlxd.supervisor.lifecycle.watchdog import check_health

    fleet = Fleet()

    async def go():
        reg = _fake_registry(tmp_path, fleet)
        slot = await reg.leases.acquire(reg.catalog.resolve("m"))
        unload = asyncio.create_task(reg.lifecycle.unload_slot(slot, "admin unload"))
        await asyncio.sleep(0.01)
        assert slot.state is State.DRAINING  # waiting for the lease to end
        fleet.spawned[0].status = "draining"  # what our own drain makes it say
        await check_health(reg.lifecycle, slot)
        assert fleet.spawned[0].returncode is None and not slot.crashes
        reg.leases.release(slot)
        assert await asyncio.wait_for(unload, 5)
        assert slot.state is State.STOPPED and reg.lifecycle.counters.crashes == 0
        await reg.shutdown()

    asyncio.run(go())


async def _until_not(slot, state):
    while slot.state is state:
        await slot.wait_change(1.0)
