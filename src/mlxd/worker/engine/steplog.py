"""The step log: one JSON line per engine step, for operators and bench (the `step_log`
setting, `MLXD_STEP_LOG`).

Where a request's first token went is a question of steps: how long each took, how many rows
it prefilled and by how much, how many decoded, how many waited. `MLXD_STEP_LOG=/path` for
`mlxd start` (or a worker's `--step-log`) appends one line per step there (bench/steps.py
summarises it), each naming its model and process, so several workers can share the file (a
worker group logs from rank 0 only). Each worker writes at most MAX_LINES, then stops with a
last line saying so; a write that fails (disk full) stops it with one warning; unset costs
nothing.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import mlx.core as mx
import orjson

from mlxd.worker.engine.trace import StepTrace

log = logging.getLogger("mlxd.worker.engine")

# Per worker process: ~100 MB, about 80 minutes of steps at 10 ms each.
MAX_LINES = 500_000


class StepLog:
    """A trace callback writing StepTraces as JSON lines to `path`."""

    def __init__(self, path: Path, model: str = "", max_lines: int = MAX_LINES):
        self._f = open(path, "ab", buffering=0)  # noqa: SIM115 (open for the engine's life)
        self._left = max_lines
        self._t0: float | None = None
        self._who = {"model": model, "pid": os.getpid()}

    def __call__(self, t: StepTrace) -> None:
        if self._left <= 0:
            return
        if self._t0 is None:
            self._t0 = t.started
        self._left -= 1
        line = {
            **self._who,
            "step": t.step,
            "t": round(t.started - self._t0, 6),
            "s": round(t.seconds, 6),
            "chunk": t.chunk,
            "admitted": len(t.admitted),
            "prefill_rows": len(t.chunks),
            "prefill_tokens": sum(n for _, n in t.chunks.values()),
            "decoded": len(t.decoded),
            "finished": len(t.finished),
            "queued": t.queued,
            "preempted": len(t.preempted),
            # MLX's memory after the step, in MiB: arrays alive, its buffer cache, and the
            # process's peak so far (a step that raised it is where memory ran high)
            "active_mb": mx.get_active_memory() >> 20,
            "cache_mb": mx.get_cache_memory() >> 20,
            "peak_mb": mx.get_peak_memory() >> 20,
        }
        if t.failed:  # the step raised (out of memory, ...): its batch was rebuilt
            line["failed"] = t.failed
        if self._left == 0:
            line["end"] = f"the step log stops at {t.step} steps (its bound)"
        try:
            self._f.write(orjson.dumps(line) + b"\n")
        except OSError as exc:  # disk full, ...: the engine goes on, the log stops
            self._left = 0
            log.warning("the step log stops: %s", exc.strerror or exc)


def open_step_log(path: Path | None, model: str = "", follower: bool = False) -> StepLog | None:
    """The step log at `path` (the `step_log` setting), or None (unset, a worker group's
    follower, or the path cannot be opened: logged once, the worker serves without it)."""
    if path is None or follower:
        return None
    try:
        return StepLog(path, model)
    except OSError as exc:
        log.warning("step_log %s cannot be opened (%s): no step log", path, exc.strerror)
        return None
