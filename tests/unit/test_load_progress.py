"""A load is never a silence: the worker's start-up phase reaches the supervisor's log and its
/admin/models row (state, phase, seconds), and mlxctl load shows it while it waits."""

from __future__ import annotations

import asyncio
import io
import logging
import threading

import pytest
from fake_workers import FakeClock, Fleet, make_registry, until

from mlxd.supervisor.admin.views import model_status
from mlxd.supervisor.ctl.client import CtlError
from mlxd.supervisor.ctl.progress import progress_line, run_with_progress


def test_a_starting_model_shows_its_phase_and_seconds_until_ready(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mlxd")
    fleet, clock = Fleet(load_s=3600), FakeClock()

    async def go():
        reg = make_registry(tmp_path, fleet, "a", clock=clock)
        lease = asyncio.create_task(reg.leases.acquire(reg.catalog.resolve("a")))
        await until(lambda: fleet.spawned and reg.lifecycle.slots["a"].phase is not None)
        row = model_status(reg, "a")
        assert (row.state, row.phase, row.load_s) == ("starting", "starting the worker process", 0)
        worker = fleet.spawned[0]
        for phase, seconds in (("loading weights", 2), ("warming up", 3)):
            clock.advance(seconds)
            worker.phase = phase
            await until(lambda p=phase: model_status(reg, "a").phase == p)
        assert model_status(reg, "a").load_s == 5.0
        worker.finish_loading()
        reg.leases.release(await asyncio.wait_for(lease, 5))
        row = model_status(reg, "a")
        assert (row.state, row.phase, row.load_s) == ("ready", None, None)
        await reg.shutdown()

    asyncio.run(go())
    lines = [r.getMessage() for r in caplog.records if "loading:" in r.getMessage()]
    assert lines == [
        "model=a loading: starting the worker process (0.0s)",
        "model=a loading: loading weights (2.0s)",
        "model=a loading: warming up (5.0s)",
    ]


def test_progress_line_names_state_phase_and_seconds():
    row = {"id": "a", "state": "starting", "phase": "warming up", "load_s": 12.4}
    assert progress_line(row) == "a: starting, warming up (12s)"
    assert progress_line({**row, "phase": None}) == "a: starting, waiting for the worker (12s)"
    assert progress_line({**row, "state": "ready"}) is None


class _Lines(io.StringIO):
    def isatty(self) -> bool:
        return False


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _scripted(rows: list):
    """A poll that answers `rows` in order; the action answers once the last is reached."""
    answered = threading.Event()
    left = list(rows)

    def poll() -> dict:
        row = left.pop(0) if len(left) > 1 else left[0]  # the last row until the answer
        if len(left) == 1:
            answered.set()
        if isinstance(row, Exception):
            raise row
        return row

    def action() -> dict:
        assert answered.wait(5)
        return {"result": "loaded"}

    return action, poll


ROWS = [
    {"id": "a", "state": "stopped"},
    {"id": "a", "state": "starting", "phase": "loading weights", "load_s": 0.4},
    CtlError("cannot reach mlxd"),
    {"id": "a", "state": "starting", "phase": "loading weights", "load_s": 1.0},
    {"id": "a", "state": "starting", "phase": "warming up", "load_s": 2.0},
    {"id": "a", "state": "ready"},
]


def test_mlxctl_load_prints_each_phase_once_off_a_terminal():
    out = _Lines()
    action, poll = _scripted(ROWS)
    assert run_with_progress(action, poll, out, interval_s=0) == {"result": "loaded"}
    assert out.getvalue() == ("a: starting, loading weights (0s)\na: starting, warming up (2s)\n")


def test_mlxctl_load_rewrites_one_line_on_a_terminal_and_clears_it():
    out = _Tty()
    action, poll = _scripted(ROWS)
    run_with_progress(action, poll, out, interval_s=0)
    assert out.getvalue() == (
        "\r\x1b[Ka: starting, loading weights (0s)"
        "\r\x1b[Ka: starting, loading weights (1s)"
        "\r\x1b[Ka: starting, warming up (2s)"
        "\r\x1b[K"
    )


def test_the_actions_error_is_raised_after_the_progress():
    def action() -> dict:
        raise CtlError("404: The model 'tiny' does not exist")

    with pytest.raises(CtlError, match="does not exist"):
        run_with_progress(action, lambda: {"state": "stopped"}, _Lines(), interval_s=0)
