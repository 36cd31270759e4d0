"""What `mlxctl load` and `reload` print while they wait: the model's state, start-up phase and
seconds, read from GET /admin/models/{id} (the row the dashboard shows too) until the action
answers. On a terminal one line is rewritten in place; elsewhere a line per new phase."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import IO, Any

from mlxd.supervisor.ctl.client import CtlError

POLL_S = 0.5


def progress_line(row: dict[str, Any]) -> str | None:
    """'a: starting, warming up (12s)' for a model being started, else None."""
    if row.get("state") != "starting":
        return None
    phase = row.get("phase") or "waiting for the worker"
    return f"{row['id']}: starting, {phase} ({row.get('load_s') or 0:.0f}s)"


def run_with_progress(
    action: Callable[[], dict],
    poll: Callable[[], dict],
    out: IO[str] | None = None,
    interval_s: float = POLL_S,
) -> dict:
    """Run `action` (a POST that answers once the load is over) on a thread and return its
    answer (or raise its error); meanwhile show `poll()`'s row as `progress_line` says."""
    out = out or sys.stderr
    tty = out.isatty()
    done = threading.Event()
    result: dict[str, Any] = {}

    def call() -> None:
        try:
            result["body"] = action()
        except BaseException as exc:  # re-raised on the caller's thread
            result["error"] = exc
        finally:
            done.set()

    threading.Thread(target=call, name="mlxctl-action", daemon=True).start()
    shown: str | None = None  # the phase last printed (lines), or the line on screen (tty)
    while not done.wait(interval_s):
        try:
            line = progress_line(poll())
        except CtlError:
            continue  # a poll that fails says nothing: the action's own answer will
        if line is None:
            continue
        if tty:
            out.write("\r\x1b[K" + line)
            shown = line
        elif line.rsplit(" (", 1)[0] != shown:  # a new phase: seconds alone are no news
            out.write(line + "\n")
            shown = line.rsplit(" (", 1)[0]
        out.flush()
    if tty and shown is not None:
        out.write("\r\x1b[K")  # the answer's own line replaces the progress
        out.flush()
    if "error" in result:
        raise result["error"]
    return result["body"]
