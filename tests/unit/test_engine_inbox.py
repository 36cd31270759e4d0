"""The engine's inbox (no MLX): typed commands, taken in order, with the queued count."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from mlxd.shared.params import GenerationParams
from mlxd.worker.engine.rows import Submission
from mlxd.worker.engine.sched.inbox import Cancel, CloseSession, Inbox, PersistCache, Stop, Submit


def sub(rid: str) -> Submission:
    return Submission(rid, [1, 2, 3], GenerationParams(max_tokens=4), lambda ev: None)


def test_commands_come_out_in_order_and_only_submissions_count_as_queued():
    inbox = Inbox()
    a, b = sub("a"), sub("b")
    done = threading.Event()
    cmds = [Submit(a), Cancel(a), PersistCache(done), CloseSession("s", done), Submit(b), Stop()]
    for cmd in cmds:
        inbox.put(cmd)
    assert inbox.queued == 2
    taken = inbox.take(block=False)
    assert next(taken) == Submit(a) and inbox.queued == 1  # counted as it is handed over
    assert list(taken) == cmds[1:] and inbox.queued == 0
    assert list(inbox.take(block=False)) == []


def test_what_arrives_while_the_inbox_is_being_taken_is_taken_too():
    inbox = Inbox()
    inbox.put(Submit(sub("a")))
    seen = []
    for cmd in inbox.take(block=False):
        seen.append(cmd.sub.rid)
        if cmd.sub.rid == "a":
            inbox.put(Submit(sub("b")))
    assert seen == ["a", "b"] and inbox.queued == 0


def test_an_empty_inbox_waits_only_when_asked_to(monkeypatch):
    from mlxd.worker.engine.sched import inbox as inbox_module

    monkeypatch.setattr(inbox_module, "IDLE_WAKE_S", 0.05)
    inbox = Inbox()
    assert list(inbox.take(block=True)) == []  # woke up after IDLE_WAKE_S with nothing
    monkeypatch.setattr(inbox_module, "IDLE_WAKE_S", 30.0)
    threading.Timer(0.01, inbox.put, [Stop()]).start()  # a command ends the wait at once
    assert list(inbox.take(block=True)) == [Stop()]


def test_commands_are_frozen_values():
    cmd = CloseSession("s", threading.Event())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cmd.session = "other"  # type: ignore[misc]
