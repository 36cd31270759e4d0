"""The queue over fake workers: first come first served across models, a full queue and a
queue timeout answer 503 with Retry-After (about one model load)."""

from __future__ import annotations

import asyncio

import pytest
from fake_workers import Fleet, make_registry, until

from mlxd.shared.errors import Unavailable


def test_waiting_models_load_in_arrival_order(tmp_path):
    fleet = Fleet(load_s=0)

    async def go():
        # The budget holds one model; a is busy, then b and c are asked for, in that order.
        reg = make_registry(tmp_path, fleet, "a", "b", "c", memory_budget_bytes=1500)
        lc, leases = reg.lifecycle, reg.leases
        a = await leases.acquire(reg.catalog.resolve("a"))
        b_task = asyncio.create_task(leases.acquire(reg.catalog.resolve("b")))
        await until(lambda: "b" in lc.slots and lc.slots["b"].waiting == 1)
        c_task = asyncio.create_task(leases.acquire(reg.catalog.resolve("c")))
        await until(lambda: "c" in lc.slots and lc.slots["c"].waiting == 1)
        await asyncio.sleep(0.02)
        assert not b_task.done() and not c_task.done()
        leases.release(a)
        b = await asyncio.wait_for(b_task, 5)
        await asyncio.sleep(0.02)
        assert not c_task.done()  # b is busy now: c waits its turn
        leases.release(b)
        leases.release(await asyncio.wait_for(c_task, 5))
        assert fleet.loads() == ["a", "b", "c"]
        await reg.shutdown()

    asyncio.run(go())


def test_a_full_queue_is_refused_at_once_with_retry_after(tmp_path):
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(tmp_path, fleet, "a", "b", "c", memory_budget_bytes=1500, queue_size=1)
        lc, leases = reg.lifecycle, reg.leases
        a = await leases.acquire(reg.catalog.resolve("a"))
        b_task = asyncio.create_task(leases.acquire(reg.catalog.resolve("b")))
        await until(lambda: leases.queued() == 1)
        with pytest.raises(Unavailable, match="queue is full") as info:
            await leases.acquire(reg.catalog.resolve("c"))
        assert info.value.retry_after_s == lc.retry_after_s() >= 1
        leases.release(a)
        leases.release(await asyncio.wait_for(b_task, 5))
        await reg.shutdown()

    asyncio.run(go())


def test_the_queue_timeout_answers_503_with_retry_after(tmp_path):
    fleet = Fleet(load_s=0)

    async def go():
        reg = make_registry(
            tmp_path, fleet, "a", "b", memory_budget_bytes=1500, queue_timeout_s=0.1
        )
        leases = reg.leases
        a = await leases.acquire(reg.catalog.resolve("a"))
        with pytest.raises(Unavailable, match=r"not ready after 0.1s in the queue") as info:
            await asyncio.wait_for(leases.acquire(reg.catalog.resolve("b")), 5)
        assert info.value.retry_after_s >= 1
        assert reg.lifecycle.slots["b"].waiting == 0  # it left the queue
        leases.release(a)
        await reg.shutdown()

    asyncio.run(go())


def test_retry_after_is_about_one_model_load(tmp_path):
    reg = make_registry(tmp_path, Fleet(), "m")
    lc = reg.lifecycle
    assert lc.retry_after_s() == 5.0  # nothing loaded yet: a guess
    for took_s, suggested in ((0.2, 1.0), (12.0, 12.0), (600.0, 60.0)):
        lc.last_load_s = took_s
        assert lc.retry_after_s() == suggested


def test_callers_during_a_start_share_it(tmp_path):
    fleet = Fleet(load_s=0.05)

    async def go():
        reg = make_registry(tmp_path, fleet, "m")
        entry = reg.catalog.resolve("m")
        slots = await asyncio.gather(*(reg.leases.acquire(entry) for _ in range(5)))
        assert len(fleet.spawned) == 1 and slots[0].leases == 5
        for slot in slots:
            reg.leases.release(slot)
        await reg.shutdown()

    asyncio.run(go())
