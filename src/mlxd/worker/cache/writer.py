"""Writes to the SSD tier happen here, off the decode path, through a bounded queue.

When the queue is full the oldest queued write is dropped and counted: that is a future cache
miss, never a wrong answer. `written` and `failed` count every outcome, so a drain can tell
whether everything it queued really landed.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mlxd.worker.cache.quiet_log import QuietLog
from mlxd.worker.cache.ssd import SsdStore

log = logging.getLogger("mlxd.worker.cache")


@dataclass(eq=False)
class WriteJob:
    ns: str
    tokens: tuple[int, ...]
    arrays: dict[str, np.ndarray]  # zero-copy views of evaluated MLX arrays
    meta: dict[str, str]
    session: str | None
    keepalive: object  # the MLX arrays behind `arrays`: they must outlive the write
    on_done: Callable[[bool], None]
    queued_at: float = field(default_factory=time.monotonic)
    replies: tuple = ()  # the generated ids among `tokens` (replies.py)


class CacheWriter:
    """One background thread draining a bounded queue of WriteJobs into an SsdStore."""

    def __init__(self, store: SsdStore, max_queued: int = 32):
        self.store = store
        self.max_queued = max_queued
        self.dropped = 0  # oldest writes pushed out of a full queue
        self.written = 0  # writes now on disk
        self.failed = 0  # writes that did not land for any reason (dropped ones included)
        self._quiet = QuietLog(log)
        self._q: collections.deque[WriteJob] = collections.deque()
        self._cv = threading.Condition()
        self._busy = False
        self._thread = threading.Thread(target=self._run, name="mlxd-cache-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def pending(self) -> int:
        return len(self._q) + (1 if self._busy else 0)

    def put(self, job: WriteJob, block: bool = False) -> None:
        """Queue a write. Normally a full queue drops its oldest write; with `block` (a drain,
        where every entry must reach the disk) the caller waits for room instead."""
        with self._cv:
            if block:
                self._cv.wait_for(lambda: len(self._q) < self.max_queued)
            if len(self._q) >= self.max_queued:
                old = self._q.popleft()
                self.dropped += 1
                self.failed += 1
                old.on_done(False)
            self._q.append(job)
            self._cv.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued write is on disk and durable; False on a timeout or when
        the final fsync failed."""
        with self._cv:
            ok = self._cv.wait_for(lambda: not self._q and not self._busy, timeout_s)
        return self.store.sync() and ok

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: bool(self._q))
                job = self._q.popleft()
                self._busy = True
            ok: bool | None = False
            try:
                ok = self.store.write(
                    job.ns,
                    job.tokens,
                    job.arrays,
                    job.meta,
                    job.session,
                    job.queued_at,
                    job.replies,
                )
            except Exception as exc:  # an unexpected array (dtype, shape): that entry only
                self._quiet.warn("SSD prompt cache write", exc)
            finally:
                if ok:
                    self.written += 1
                elif ok is False:  # None: its session closed, nothing was lost
                    self.failed += 1
                job.on_done(bool(ok))
                del job  # its arrays (on CUDA, copies) go now, not when the next job comes
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
