"""The engine's inbox: typed commands from the event loop to the engine thread.

Every request the engine can get is one small frozen dataclass here; the engine thread
dispatches on the type (loop.Engine._handle). The inbox also counts submissions in and
admissions out, so `queued` can be read from any thread: each counter has one writer.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from mlxd.shared.errors import MlxdError
from mlxd.worker.engine.rows import Submission


@dataclass(frozen=True)
class Submit:
    """Admit this request into the batch at the next step."""

    sub: Submission


@dataclass(frozen=True)
class Cancel:
    """Drop this request's row at the next step (`sub.cancel_reason` says what it hears)."""

    sub: Submission


@dataclass(frozen=True)
class PersistCache:
    """Queue every RAM prompt-cache entry for the SSD tier; set `done` once queued."""

    done: threading.Event


@dataclass(frozen=True)
class CloseSession:
    """Forget a session's prompt-cache entries in both tiers; set `done` once forgotten."""

    session: str
    done: threading.Event


@dataclass(frozen=True)
class Stop:
    """Exit the thread once the rows in flight are done or cancelled."""


class Job(Protocol):
    """Work that is not a batch row (one embedding forward): `run` on the engine thread,
    never raising; `fail` when the engine cannot run it."""

    def run(self, stream: Any) -> None: ...

    def fail(self, err: MlxdError | None) -> None: ...


@dataclass(frozen=True)
class RunJob:
    """Run one Job on the engine thread between steps."""

    job: Job


@dataclass(frozen=True)
class CloseGroup:
    """A worker group's rank 0 passed its drain deadline: every rank admits nothing more
    (only a group's engines get it; group/engine.py)."""


Command = Submit | Cancel | PersistCache | CloseSession | Stop | RunJob | CloseGroup

# An idle engine still wakes this often (prompt-cache upkeep).
IDLE_WAKE_S = 1.0


class Inbox:
    """A thread-safe queue of Commands: any thread puts, the engine thread takes."""

    def __init__(self):
        self._q: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self.submitted = 0  # written by the putting side only
        self.admitted = 0  # written by the engine thread only

    @property
    def queued(self) -> int:
        """Submissions not yet taken by the engine thread."""
        return max(0, self.submitted - self.admitted)

    def put(self, cmd: Command) -> None:
        if isinstance(cmd, Submit):
            self.submitted += 1
        self._q.put(cmd)

    def take(self, block: bool) -> Iterator[Command]:
        """Everything waiting, one at a time, including what arrives meanwhile; with `block`,
        wait up to IDLE_WAKE_S for the first."""
        try:
            cmd = self._q.get(timeout=IDLE_WAKE_S) if block else self._q.get_nowait()
            while True:
                if isinstance(cmd, Submit):
                    self.admitted += 1
                yield cmd
                cmd = self._q.get_nowait()
        except queue.Empty:
            return
