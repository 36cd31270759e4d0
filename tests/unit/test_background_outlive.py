"""A request that runs its work in the background (shared/background.py): the work outlives
the client; shutdown cancelling the work gives the request a 503, never a connection closed
without an answer (found by a probe, 2026-12-07: SIGTERM during `mlxctl reload`)."""

from __future__ import annotations

import asyncio

import pytest

from mlxd.shared.background import Background, outlive_client
from mlxd.shared.errors import Unavailable


def test_shutdown_cancelling_the_work_is_a_503_for_the_request_waiting_on_it():
    async def go():
        tasks = Background()
        work = tasks.spawn(asyncio.sleep(60))
        request = asyncio.create_task(outlive_client(work, "The reload of 'm'"))
        await asyncio.sleep(0)
        tasks.cancel_all()  # the daemon's shutdown
        with pytest.raises(Unavailable, match="The reload of 'm' did not finish: mlxd is shutting"):
            await request

    asyncio.run(go())


def test_a_request_whose_client_left_is_cancelled_and_its_work_goes_on():
    async def go():
        tasks = Background()
        work = tasks.spawn(asyncio.sleep(0.05, result="reloaded"))
        request = asyncio.create_task(outlive_client(work, "The reload of 'm'"))
        await asyncio.sleep(0)
        request.cancel()  # aiohttp cancels the handler of a client that hung up
        with pytest.raises(asyncio.CancelledError):
            await request
        assert await work == "reloaded"
        assert await outlive_client(tasks.spawn(asyncio.sleep(0, result=1)), "x") == 1

    asyncio.run(go())


def test_a_streamed_create_cut_short_by_shutdown_ends_in_an_error_not_success():
    """A review (2026-12-07): a cancelled build queued the end marker, so /api/create cut
    short by shutdown ended its stream as if it had succeeded."""
    from mlxd.supervisor.http.ollama_manage import _outcome
    from mlxd.supervisor.store.pulls import END

    async def go():
        cut = asyncio.create_task(asyncio.sleep(60))
        await asyncio.sleep(0)
        cut.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cut
        done = asyncio.create_task(asyncio.sleep(0))
        await done
        return _outcome(cut), _outcome(done)

    cut, done = asyncio.run(go())
    assert isinstance(cut, Unavailable) and "shutting down" in cut.message and done is END
