"""The SSD write policy: which RAM entries reach the SSD tier, and when.

Before a drain only entries that earned it reach the SSD: a session's (`session_id`, ...), or
one reused for real (a prefix of at least `earn_tokens` served from it or from a prefix it
replaced, so turn N+1 of a conversation inherits turn N's hit). They go through the writer
after a quiet period (write-behind) or when RAM evicts them (spill); other evicted entries are
dropped, so a run of unique prompts writes nothing. Drain, flush and shutdown write every RAM
entry. Persisted entries idle long enough leave RAM (demotion).
"""

from __future__ import annotations

import logging
import threading
import time

from mlxd.worker.cache.kv_arrays import device_copies, storable, to_numpy
from mlxd.worker.cache.quiet_log import QuietLog
from mlxd.worker.cache.ram import Entry, RamCache
from mlxd.worker.cache.ssd import SsdStore
from mlxd.worker.cache.writer import CacheWriter, WriteJob

log = logging.getLogger("mlxd.worker.cache")

WRITE_REASONS = ("session", "reused", "drain")

# The bytes of device-made copies (kv_arrays.device_copies, CUDA) queued writes may hold at
# once. A write-behind that would pass it waits for a later round; an entry larger than it is
# read in place (its next use faults it back once: bounded memory first). Spills, drains and
# entries too large for RAM are read in place (they leave the device anyway).
COPY_BYTES_MAX = 4 << 30


def write_reason(e: Entry) -> str:
    """Why an entry is on its way to the SSD tier, as the stats count it."""
    if e.session is not None:
        return "session"
    return "reused" if e.hits else "drain"  # the rest only a drain, flush or shutdown writes


class WritePolicy:
    """Hands RAM entries to the SSD tier's writer: write-behind, spill, drain; and demotes."""

    def __init__(
        self,
        ram: RamCache,
        ssd: SsdStore | None,
        *,
        quiet_s: float,
        idle_s: float,
        max_queued_writes: int,
    ):
        self.ram = ram
        self.ssd = ssd
        self.writer = CacheWriter(ssd, max_queued_writes) if ssd is not None else None
        self.quiet_s = quiet_s
        self.idle_s = idle_s
        self.spills = 0
        self.demotions = 0
        self.unsupported = 0
        self.written = dict.fromkeys(WRITE_REASONS, 0)  # entries that landed on the SSD, by why
        self.copy_bytes = 0  # held by queued writes' device-made copies (COPY_BYTES_MAX)
        self._copy_lock = threading.Lock()  # the writer thread gives them back
        self._quiet = QuietLog(log)

    # -- any thread -------------------------------------------------------------------------
    def flush(self, timeout_s: float = 60.0) -> bool:
        return self.writer.flush(timeout_s) if self.writer is not None else True

    @property
    def writable(self) -> bool:
        """Whether entries can reach the SSD at all (a tier that is on and not read-only)."""
        return self.ssd is not None and self.ssd.disabled is None and not self.ssd.read_only

    def tally(self) -> tuple[int, int]:
        """(writes landed, writes failed) so far: a drain reports the difference it made."""
        w = self.writer
        return (w.written, w.failed) if w is not None else (0, 0)

    # -- engine thread ----------------------------------------------------------------------
    def maintain(self, now: float | None = None) -> None:
        """Write-behind of settled entries that earned it, and demotion of idle ones."""
        if self.ssd is None:
            return
        self.ssd.sweep_leftovers()
        now = time.monotonic() if now is None else now
        for e in self.ram.entries():
            if e.ram_only:
                continue
            if e.earned and not e.persisted and not e.queued and now - e.created >= self.quiet_s:
                self.enqueue(e)
            elif e.persisted and now - e.last_used >= self.idle_s:
                self.ram.drop(e)
                self.demotions += 1

    def persist_all(self) -> int:
        """Queue every RAM entry not yet on the SSD, earned or not (drain, flush, shutdown)."""
        n = 0
        for e in self.ram.entries():
            if not e.persisted and not e.queued and not e.ram_only:
                # A drain must not drop writes; in place: the worker stops, or (a flush) the
                # next use of an entry faults it back once (no copies of every entry at once).
                self.enqueue(e, block=True, in_place=True)
                n += 1
        return n

    def spill(self, e: Entry) -> None:
        """RAM evicted `e`: to the SSD tier if it earned that, else dropped."""
        if not e.earned:  # evicted from RAM without having earned the SSD: dropped
            return
        if self.ssd is not None and not e.persisted and not e.queued and not e.ram_only:
            self.spills += 1
            self.enqueue(e, in_place=True)  # it left RAM: nothing will use it on the device

    def enqueue(self, e: Entry, block: bool = False, in_place: bool = False) -> None:
        """Hand `e`'s arrays to the writer (`block`: wait for room, not drop the oldest write).
        On CUDA the writer reads device-made copies unless `in_place` (kv_arrays.to_numpy);
        a write-behind that would hold more than COPY_BYTES_MAX of them waits a round."""
        if not self.writable:
            return  # no array copies for a tier that cannot take them
        writer = self.writer
        assert writer is not None  # writable: there is an SSD tier, so its writer
        if not storable(e.layers):
            # Kinds the SSD tier cannot hold (kv_arrays.storable) stay in RAM (never
            # demoted) and are not queued again.
            if not e.ram_only:
                self.unsupported += 1
            e.ram_only = True
            return

        copy = device_copies() and not in_place and e.nbytes <= COPY_BYTES_MAX
        copies = e.nbytes if copy else 0
        with self._copy_lock:
            if copies and self.copy_bytes + copies > COPY_BYTES_MAX:
                return  # still unqueued: the next maintain() tries again
            self.copy_bytes += copies

        def done(ok: bool, e=e) -> None:  # on the writer thread, the only one counting
            e.queued = False
            e.persisted = ok
            self._give_back(copies)
            if ok:
                self.written[reason] += 1

        try:
            reason = write_reason(e)
            arrays, meta, keep = to_numpy(e.layers, copy=copy)
            e.queued = True
            job = WriteJob(e.ns, e.tokens, arrays, meta, e.session, keep, done, replies=e.replies)
            writer.put(job, block)
        except Exception as exc:  # runs on the engine thread: a hand-off may cost the entry only
            e.queued = False
            self._give_back(copies)
            writer.failed += 1
            self._quiet.warn("SSD prompt cache hand-off to the writer", exc)

    def _give_back(self, copies: int) -> None:
        with self._copy_lock:
            self.copy_bytes -= copies
