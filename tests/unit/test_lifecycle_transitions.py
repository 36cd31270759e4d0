"""The state machine's one door: a compare-and-swap transition, called only by the owner."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import pytest

from mlxd.supervisor.catalog.discovery import ModelEntry
from mlxd.supervisor.lifecycle.slot import ModelSlot
from mlxd.supervisor.lifecycle.states import InvalidTransition, State

SUPERVISOR = Path(__file__).resolve().parents[2] / "src" / "mlxd" / "supervisor"


def _slot() -> ModelSlot:
    entry = ModelEntry("m", Path("/nonexistent"), "home", 0)
    return ModelSlot(entry=entry, settings=None, socket=Path("/tmp/m.sock"), estimate_bytes=0)


def test_transition_is_a_compare_and_swap(caplog):
    caplog.set_level(logging.INFO, logger="mlxd")

    async def go():
        slot = _slot()
        changed = slot.changed
        assert not slot.transition(State.READY, State.DRAINING)  # not READY: nothing moves
        assert slot.state is State.STOPPED and not changed.is_set()
        assert slot.transition(State.STOPPED, State.STARTING, "load")
        assert slot.state is State.STARTING and changed.is_set()
        cold = frozenset({State.STOPPED, State.BACKOFF})
        assert not slot.transition(cold, State.STARTING)
        assert slot.transition(State.STARTING, State.READY)

    asyncio.run(go())
    assert "model=m from=stopped to=starting (load)" in caplog.text


def test_a_move_the_state_machine_forbids_raises_whatever_the_state():
    async def go():
        slot = _slot()
        with pytest.raises(InvalidTransition):
            slot.transition(State.STOPPED, State.READY)  # READY only after STARTING
        with pytest.raises(InvalidTransition):
            slot.transition(State.FATAL, State.STARTING)  # even though it is not FATAL

    asyncio.run(go())


def test_only_the_lifecycle_owner_changes_states_and_routing():
    """No module but owner.py moves a slot or writes the routing table (conventions 2, 13)."""
    movers, routers = set(), set()
    for path in SUPERVISOR.rglob("*.py"):
        text = path.read_text()
        if re.search(r"\.transition\(", text):
            movers.add(path.name)
        if re.search(r"\bslots\[[^\]]+\]\s*=[^=]", text) or re.search(
            r"(?<!row)\.state\s*=[^=]", text
        ):
            routers.add(path.name)
    assert movers == {"owner.py"}
    assert routers <= {"owner.py", "slot.py"}
