"""Fair leases under a budget that holds one model: hand-over, first come first served,
queue_timeout_s with Retry-After, and min_residency_s. Fake workers (tests/fake_workers.py)."""

from __future__ import annotations

import asyncio

import pytest
from fake_workers import FakeClock, Fleet, make_models, settings_for, until

from mlxd.shared.errors import Unavailable
from mlxd.supervisor.lifecycle.states import State
from mlxd.supervisor.registry.registry import Registry


def registry(tmp_path, fleet: Fleet, clock=None, **overrides) -> Registry:
    make_models(tmp_path, "a", "b")
    # Each model's footprint is 1000 bytes: the budget holds one of them.
    settings = settings_for(tmp_path, memory_budget_bytes=1500, **overrides)
    extra = {} if clock is None else {"clock": clock}
    return Registry.build(
        settings, fleet, total_memory_bytes=1 << 34, spawner=fleet.spawner, **extra
    )


async def ticking(clock: FakeClock, tick_s: float = 0.005) -> None:
    """Move `clock` by a tick after each real tick: it never runs ahead of the event loop, so
    a loaded machine slows the clock down instead of making waits look long."""
    while True:
        await asyncio.sleep(tick_s)
        clock.advance(tick_s)


async def stays_pending(task: asyncio.Task, yields: int = 20) -> bool:
    """`task` is still waiting after the loop ran everything ready `yields` times (and any
    timer it armed had a chance to fire: the clock it reads has not moved)."""
    for _ in range(yields):
        await asyncio.sleep(0.01)
    return not task.done()


def test_two_busy_models_both_served_and_nobody_waits_past_the_timeout(tmp_path):
    """The livelock of issue 11: every client gets a lease or a 503 with Retry-After in time."""
    fleet = Fleet(load_s=0.05)
    queue_timeout_s = 1.5
    clock = FakeClock()

    async def go():
        reg = registry(tmp_path, fleet, clock, queue_timeout_s=queue_timeout_s)
        ticker = asyncio.create_task(ticking(clock))
        served = {"a": 0, "b": 0}
        refused, waits = [], []
        stop_at = clock() + 4.0

        async def client(model: str):
            while clock() < stop_at:
                t0 = clock()
                try:
                    async with reg.leases.lease(model):
                        waits.append(clock() - t0)
                        await asyncio.sleep(0.02)  # the response streams
                        served[model] += 1
                except Unavailable as exc:
                    waits.append(clock() - t0)
                    refused.append(exc)
                    assert exc.retry_after_s and exc.retry_after_s >= 1

        clients = asyncio.gather(*(client(m) for m in ("a", "b") for _ in range(3)))
        await asyncio.wait_for(clients, 120)  # a livelock hangs here
        ticker.cancel()
        await reg.shutdown()
        return served, refused, waits

    served, refused, waits = asyncio.run(go())
    assert served["a"] > 0 and served["b"] > 0, served
    # On the lifecycle's own clock: the model's own load is not queue time; allow for one
    # load and a wake-up.
    assert max(waits) < queue_timeout_s + 0.5, max(waits)
    # Each READY served its waiters: far fewer loads than requests.
    assert len(fleet.spawned) < served["a"] + served["b"]


def test_fresh_model_serves_its_waiters_before_it_can_be_evicted(tmp_path):
    fleet = Fleet(load_s=0.05)

    async def go():
        reg = registry(tmp_path, fleet)
        a = await reg.leases.acquire(reg.catalog.resolve("a"))
        b_waiters = [
            asyncio.create_task(reg.leases.acquire(reg.catalog.resolve("b"))) for _ in range(3)
        ]
        await until(lambda: "b" in reg.lifecycle.slots and reg.lifecycle.slots["b"].waiting == 3)
        # a's request arrives after b's
        a_waiter = asyncio.create_task(reg.leases.acquire(reg.catalog.resolve("a")))
        await asyncio.sleep(0.05)
        assert not a_waiter.done(), "a took a new lease although b waited first"
        reg.leases.release(a)  # a is idle now: evicted for b
        b_slots = await asyncio.wait_for(asyncio.gather(*b_waiters), 5)
        assert all(s.state is State.READY and s.id == "b" for s in b_slots)
        assert reg.lifecycle.slots["b"].leases == 3 and not a_waiter.done()
        for s in b_slots:
            reg.leases.release(s)
        a2 = await asyncio.wait_for(a_waiter, 5)  # then a again, for its waiter
        assert a2.id == "a" and reg.lifecycle.slots["b"].state is State.STOPPED
        reg.leases.release(a2)
        await reg.shutdown()

    asyncio.run(go())
    assert fleet.loads() == ["a", "b", "a"]


def test_requests_older_than_the_waiting_load_are_still_served(tmp_path):
    """Closing a busy model only turns away requests that arrived after the waiting one."""
    fleet = Fleet()

    async def go():
        reg = registry(tmp_path, fleet)
        a = await reg.leases.acquire(reg.catalog.resolve("a"))
        b_waiter = asyncio.create_task(reg.leases.acquire(reg.catalog.resolve("b")))
        await until(lambda: reg.lifecycle.admission.cutoff(reg.lifecycle.slots["a"]) is not None)
        cutoff = reg.lifecycle.admission.cutoff(reg.lifecycle.slots["a"])
        assert reg.lifecycle.admission.admits(reg.lifecycle.slots["a"], cutoff - 1)
        assert not reg.lifecycle.admission.admits(reg.lifecycle.slots["a"], cutoff)
        reg.leases.release(a)
        reg.leases.release(await asyncio.wait_for(b_waiter, 5))
        # the marks go with the load
        assert reg.lifecycle.admission.cutoff(reg.lifecycle.slots["a"]) is None
        await reg.shutdown()

    asyncio.run(go())


def test_queue_timeout_gives_503_with_retry_after_then_serves(tmp_path):
    fleet = Fleet()

    async def go():
        clock = FakeClock()
        reg = registry(tmp_path, fleet, clock, queue_timeout_s=0.4)
        a = await reg.leases.acquire(reg.catalog.resolve("a"))  # a stays busy
        b_waiter = asyncio.create_task(reg.leases.acquire(reg.catalog.resolve("b")))
        await until(lambda: "b" in reg.lifecycle.slots and reg.lifecycle.slots["b"].waiting == 1)
        clock.advance(0.35)
        assert await stays_pending(b_waiter), "refused before queue_timeout_s"
        clock.advance(0.1)
        with pytest.raises(Unavailable, match="queue_timeout_s") as info:
            await asyncio.wait_for(b_waiter, 5)
        assert info.value.retry_after_s >= 1
        # Nobody waits for b any more: a takes new requests again, and b's load let go.
        a2 = await asyncio.wait_for(reg.leases.acquire(reg.catalog.resolve("a")), 3)
        assert reg.lifecycle.slots["a"].leases == 2
        reg.leases.release(a)
        reg.leases.release(a2)
        b = await asyncio.wait_for(reg.leases.acquire(reg.catalog.resolve("b")), 3)
        assert b.state is State.READY
        reg.leases.release(b)
        await reg.shutdown()

    asyncio.run(go())


def test_full_queue_is_refused_at_once_with_retry_after(tmp_path):
    fleet = Fleet()

    async def go():
        clock = FakeClock()  # never moves: a refusal that waited for the timeout would hang
        reg = registry(tmp_path, fleet, clock, queue_size=1, queue_timeout_s=5)
        a = await reg.leases.acquire(reg.catalog.resolve("a"))
        first = asyncio.create_task(reg.leases.acquire(reg.catalog.resolve("b")))
        await until(
            lambda: (
                reg.leases.queued() == 1 or reg.lifecycle.admission.cutoff(reg.lifecycle.slots["a"])
            )
        )
        await asyncio.sleep(0.05)
        with pytest.raises(Unavailable, match="queue is full") as info:
            # held behind b, and the queue is full
            await asyncio.wait_for(reg.leases.acquire(reg.catalog.resolve("a")), 5)
        assert info.value.retry_after_s >= 1
        reg.leases.release(a)
        reg.leases.release(await asyncio.wait_for(first, 5))
        await reg.shutdown()

    asyncio.run(go())


def test_min_residency_keeps_a_fresh_model_loaded(tmp_path):
    fleet = Fleet(load_s=0.01)

    async def go():
        clock = FakeClock()
        reg = registry(tmp_path, fleet, clock, min_residency_s=0.6)
        reg.leases.release(await reg.leases.acquire(reg.catalog.resolve("a")))
        b_waiter = asyncio.create_task(reg.leases.acquire(reg.catalog.resolve("b")))
        clock.advance(0.5)
        assert await stays_pending(b_waiter), "a was evicted before min_residency_s"  # idle, young
        clock.advance(0.2)
        b = await asyncio.wait_for(b_waiter, 5)
        reg.leases.release(b)
        await reg.shutdown()

    asyncio.run(go())
    assert fleet.loads() == ["a", "b"]


def test_retry_after_header_in_both_envelopes():
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from mlxd.shared.middleware import error_middleware

    async def busy(request):
        raise Unavailable("Every loaded model is busy", retry_after_s=2.2)

    async def fatal(request):
        raise Unavailable("Model 'm' is FATAL")

    async def go():
        app = web.Application(middlewares=[error_middleware])
        app.router.add_post("/v1/chat/completions", busy)
        app.router.add_post("/v1/messages", busy)
        app.router.add_post("/v1/completions", fatal)
        async with TestClient(TestServer(app)) as client:
            r = await client.post("/v1/chat/completions")
            assert r.status == 503 and r.headers["Retry-After"] == "3"
            assert (await r.json())["error"]["message"] == "Every loaded model is busy"
            r = await client.post("/v1/messages")
            assert r.status == 503 and r.headers["Retry-After"] == "3"
            assert (await r.json())["error"]["type"] == "overloaded_error"
            r = await client.post("/v1/completions")  # retrying will not help: no header
            assert r.status == 503 and "Retry-After" not in r.headers

    asyncio.run(go())
