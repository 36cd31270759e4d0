"""A pull's progress in Ollama's shape (`shared/wire/ollama_manage.py`'s ProgressLine): which
lines go out, what a client that joins late is shown, and the text mlxctl prints for each.

Ollama's statuses: "pulling manifest", one "pulling <file>" line per file with its digest,
total and completed bytes (sent as bytes arrive, at most one per file every THROTTLE_S),
"verifying sha256 digest", "writing manifest", "success". Pure: the clock is passed in.
"""

from __future__ import annotations

from collections.abc import Callable

from mlxd.shared.sizes import format_size
from mlxd.shared.wire.ollama_manage import ProgressLine
from mlxd.supervisor.store.hub import RemoteFile

MANIFEST = "pulling manifest"
VERIFYING = "verifying sha256 digest"
WRITING = "writing manifest"
SUCCESS = "success"
THROTTLE_S = 0.25


def line(status: str) -> ProgressLine:
    """A status line."""
    return ProgressLine(status=status)


def file_line(file: RemoteFile, completed: int) -> ProgressLine:
    """A file's progress line."""
    return ProgressLine(
        status=f"pulling {file.name}", digest=file.digest, total=file.size, completed=completed
    )


class Throttle:
    """Whether a file's progress line goes out now: its first and last always, the ones
    between at most every `interval_s` of `clock`."""

    def __init__(self, clock: Callable[[], float], interval_s: float = THROTTLE_S):
        self.clock = clock
        self.interval_s = interval_s
        self._last: dict[str, float] = {}

    def due(self, key: str, finished: bool) -> bool:
        now = self.clock()
        last = self._last.get(key)
        if finished or last is None or now - last >= self.interval_s:
            self._last[key] = now
            return True
        return False


def add_to_backlog(backlog: list[ProgressLine], line: ProgressLine) -> None:
    """What a client joining a pull under way is shown first: every status line in order, a
    file's progress as its latest line only."""
    if line.digest is not None and backlog and backlog[-1].digest == line.digest:
        backlog[-1] = line
    else:
        backlog.append(line)


def line_text(line: ProgressLine) -> str:
    """One line as mlxctl prints it: `pulling model.safetensors  7 MiB / 14 MiB (50%)`."""
    if line.total:
        done = line.completed or 0
        pct = done * 100 // line.total
        return f"{line.status}  {format_size(done)} / {format_size(line.total)} ({pct}%)"
    return line.status
