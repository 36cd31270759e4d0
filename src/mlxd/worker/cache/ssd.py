"""The SSD tier of the prompt cache: the store that reads, writes and evicts entries (its scans
of the folder are ssd_scan.py).

Files live in `<cache root>/<model id>/<fingerprint>/` (layout.py); what their bytes are, how
they are written and how they are verified on every read is format.py; what is indexed, and
which entry the byte cap evicts next (LRU), is ssd_index.py. A damaged file or one
shaped for another model is deleted and counted, never loaded. The tier never stops a worker:
an OSError listing the folder turns it off for the run, one on a file skips that file; each is
counted and logged once a minute per kind. NumPy and file I/O only: safe off the engine thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np

from mlxd.worker.cache import ssd_scan
from mlxd.worker.cache.digest import PIECE_BYTES
from mlxd.worker.cache.format import (
    Layout,
    LayoutMismatch,
    SsdEntry,
    data_path,
    encode_entry,
    entry_key,
    entry_paths,
    fsync_dir,
    write_entry,
)
from mlxd.worker.cache.kinds import trims
from mlxd.worker.cache.quiet_log import QuietLog
from mlxd.worker.cache.restore_read import Buffers, read_checked
from mlxd.worker.cache.ssd_index import SsdIndex
from mlxd.worker.cache.ssd_leftovers import Leftovers

log = logging.getLogger("mlxd.worker.ssd")

# After a failed write (a full disk, a read-only folder) writes pause this long instead of
# failing one by one, each after writing most of a file.
WRITE_PAUSE_S = 30.0
# The store's counters (`stats`); bytes_written counts data files and sidecars that reached
# the disk.
STATS = (
    "hits restores writes bytes_written corrupt evictions rejected write_errors write_skipped"
    " read_errors delete_errors scan_errors"
).split()


class SsdStore:
    """Index and files of one model's SSD entries. Thread-safe.

    `layout`, when set, is the model's KV signature: an entry that does not match it is a miss
    and is deleted. `disabled` says why the tier is off for this run (None while it is on).
    """

    def __init__(
        self,
        folder: Path,
        cap_bytes: int,
        layout: Layout | None = None,
        buffers: Buffers | None = None,
    ):
        self.dir = folder
        self.cap_bytes = cap_bytes
        self.layout = layout
        # What a read fills: one MLX array per tensor from the prompt cache
        # (kv_arrays.mlx_buffers, restore_read.py), so that a restore copies nothing; when
        # None, one NumPy buffer for the whole file (digest.read_hashed).
        self.buffers = buffers
        self.disabled: str | None = None
        self.read_only = False
        self.index = SsdIndex()
        self._lock = threading.RLock()  # closed sessions against writes landing meanwhile
        self._closed_sessions: dict[str, float] = {}  # session -> when it was closed
        self._paused_until = 0.0  # writes skip until then (monotonic), after a failed write
        self._quiet = QuietLog(log)
        self.leftovers = Leftovers(folder, self._delete_failed)
        self.stats = dict.fromkeys(STATS, 0)

    def __len__(self) -> int:
        return len(self.index)

    @property
    def nbytes(self) -> int:
        return self.index.nbytes

    @property
    def errors(self) -> int:
        """OSErrors met in any part: scan, read, write, delete."""
        s = self.stats
        return s["scan_errors"] + s["read_errors"] + s["write_errors"] + s["delete_errors"]

    def disable(self, reason: str) -> None:
        """Turn the tier off for this run (one log line); the worker serves from RAM."""
        if self.disabled is None:
            log.error("SSD prompt cache off for this run, serving from RAM only: %s", reason)
        self.disabled = reason
        self.index.clear()

    # -- index ------------------------------------------------------------------------------
    def scan(self) -> int:
        """Index what a previous run left (restart survival); drop what is incomplete
        (ssd_scan.scan)."""
        return ssd_scan.scan(self)

    def rescan(self) -> int:
        """Bring the index in line with the folder after another process wrote to it
        (ssd_scan.rescan); how many entries were added."""
        return ssd_scan.rescan(self)

    def sweep_leftovers(self, now: float | None = None) -> int:
        """Remove the leftovers the scan found too recent, once old enough; how many went."""
        if self.disabled is not None or not self.leftovers.waiting:
            return 0
        n = self.leftovers.sweep(time.time() if now is None else now)
        if n:
            log.info("SSD prompt cache: removed %d leftover files from %s", n, self.dir)
        return n

    def _delete_failed(self, exc: OSError) -> None:
        self.stats["delete_errors"] += 1
        self._quiet.warn("SSD prompt cache delete", exc)

    def _remove(self, e: SsdEntry) -> None:
        if self.index.forget(e):
            self._delete_files(e.key)

    def _delete_files(self, key: str) -> None:
        for path in entry_paths(self.dir, key):
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:  # a folder under that name, a read-only folder
                self._delete_failed(exc)

    def best(self, ns: str, prompt: list[int]) -> tuple[SsdEntry | None, int]:
        """The entry covering most of `prompt`, and how many tokens it covers."""
        exact = self.layout is not None and not trims(self.layout)
        return self.index.best(ns, prompt, exact)

    def near(self, ns: str, prompt: list[int], limit: int) -> list[SsdEntry]:
        """Entries with replies sharing a prefix with `prompt` (replies.py)."""
        return self.index.near(ns, prompt, limit)

    def drop_session(self, session: str) -> int:
        with self._lock:
            # Writes queued for it before now must not land; later use of the id starts afresh.
            self._closed_sessions[session] = time.monotonic()
            victims = self.index.of_session(session)
        for e in victims:
            self._remove(e)
        return len(victims)

    def discard(self, e: SsdEntry, why: BaseException) -> None:
        """Drop an entry that failed after it was read (its restore raised): never again."""
        self.stats["rejected"] += 1
        self._quiet.warn("SSD prompt cache restore", why)
        self._remove(e)

    # -- data -------------------------------------------------------------------------------
    def read(self, e: SsdEntry, use: bool = True) -> dict[str, np.ndarray] | None:
        """The entry's arrays after checking size, hash, token ids and (with a layout) shapes;
        None, and the entry dropped, when anything is off. `use`: a request's (`used`)."""
        if self.disabled is not None:
            return None
        path = data_path(self.dir, e.key)
        try:
            arrays = read_checked(path, e, self.layout, self.buffers)
        except FileNotFoundError:  # evicted meanwhile, or removed by hand: a plain miss
            self.index.forget(e)
            return None
        except OSError as exc:
            self.stats["read_errors"] += 1
            self._quiet.warn("SSD prompt cache read", exc)
            self._remove(e)
            return None
        except LayoutMismatch as exc:
            log.warning(
                "discarding SSD cache entry %s made for another model shape: %s", e.key, exc
            )
            self.stats["rejected"] += 1
            self._remove(e)
            return None
        except Exception as exc:  # the file is untrusted: any parse failure is damage
            log.warning("discarding corrupt SSD cache entry %s: %s", e.key, exc)
            self.stats["corrupt"] += 1
            self._remove(e)
            return None
        if use:
            self.used(e)
        return arrays

    def used(self, e: SsdEntry) -> None:
        """A request restored `e` (read-ahead reads are not uses): counted, recency renewed."""
        e.last_used = time.time()
        with contextlib.suppress(OSError):
            os.utime(data_path(self.dir, e.key))
        self.stats["restores"] += 1

    def write(
        self,
        ns: str,
        tokens: tuple[int, ...],
        arrays: dict[str, np.ndarray],
        meta: dict[str, str],
        session: str | None,
        queued_at: float | None = None,
        replies: tuple = (),
    ) -> bool | None:
        """Persist one entry atomically, then keep the folder under its byte cap.

        True: the entry is on disk. False: it is not (an I/O error, no room, the tier off).
        None: it was not wanted any more (its session closed while the write was queued)."""
        if self.disabled is not None or self.read_only or time.monotonic() < self._paused_until:
            self.stats["write_skipped"] += 1
            return False
        key = entry_key(ns, tokens)
        parts, sidecar, size, digest = encode_entry(ns, tokens, arrays, meta, session, replies)
        if size > self.cap_bytes:
            self.stats["write_skipped"] += 1
            return False
        try:
            self.dir.mkdir(parents=True, exist_ok=True)  # it may have been removed by hand
            write_entry(self.dir, key, parts, sidecar)
            self.stats["bytes_written"] += size + len(sidecar)
        except OSError as exc:
            self.stats["write_errors"] += 1
            self._paused_until = time.monotonic() + WRITE_PAUSE_S
            self._quiet.warn("SSD prompt cache write (writes paused a while)", exc)
            self._delete_files(key)
            return False
        with self._lock:
            closed_at = self._closed_sessions.get(session) if session is not None else None
            if closed_at is not None and (queued_at is None or queued_at <= closed_at):
                self._delete_files(key)  # the session was closed while this write was queued
                return None
            e = SsdEntry(key, ns, tokens, size, digest, session, time.time(), replies, PIECE_BYTES)
            self.index.add(e)
        self.stats["writes"] += 1
        self._enforce_cap()
        return True

    def sync(self) -> bool:
        """Make renames durable (fsync of the folder); False when that failed."""
        if self.disabled is not None:
            return False
        try:
            fsync_dir(self.dir)
        except FileNotFoundError:  # nothing was ever written
            return True
        except OSError as exc:
            self.stats["write_errors"] += 1
            self._quiet.warn("SSD prompt cache sync", exc)
            return False
        return True

    def _enforce_cap(self) -> None:
        while self.nbytes > self.cap_bytes:
            victim = self.index.least_recent()
            if victim is None:
                return
            self._remove(victim)
            self.stats["evictions"] += 1
