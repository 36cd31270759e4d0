"""The prompt cache: a RAM tier on the engine thread, backed by an SSD tier that outlives us.

Which entries reach the SSD, and when, is the write policy's (write_policy.py). A RAM miss
that an SSD entry covers by at least `earn_tokens` more is served by restoring that entry, read
and verified off the engine thread (shapes against the model's layout included); a restore that
still fails drops that entry and the request runs as a miss.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from mlxd.worker.cache.entry_caches import compact, usable_length, view
from mlxd.worker.cache.format import Layout, LayoutMismatch, check_layout
from mlxd.worker.cache.kinds import trims
from mlxd.worker.cache.kv_arrays import device_copies, from_numpy, mlx_buffers
from mlxd.worker.cache.ram import EARN_TOKENS, Entry, RamCache
from mlxd.worker.cache.replies import Reply, clip
from mlxd.worker.cache.ssd import SsdEntry, SsdStore
from mlxd.worker.cache.trie import common_prefix
from mlxd.worker.cache.write_policy import WritePolicy
from mlxd.worker.model.blocks import aligned_hit

log = logging.getLogger("mlxd.worker.cache")


class PromptCache:
    """Both tiers: lookup, restore and store; `writes`, the policy between them."""

    def __init__(
        self,
        ram_bytes: int,
        ssd_dir: Path | None,
        ssd_bytes: int,
        *,
        layout: Layout | None = None,
        quiet_s: float = 2.0,
        idle_s: float = 300.0,
        max_queued_writes: int = 32,
        earn_tokens: int = EARN_TOKENS,
    ):
        self.earn_tokens = earn_tokens
        # RAM's evictions go to the write policy: a spill to the SSD if earned.
        self.ram = RamCache(
            ram_bytes, on_evict=lambda e: self.writes.spill(e), earn_tokens=earn_tokens
        )
        # Restores read each tensor into an MLX array (mlx_buffers): no copy after the read.
        self.ssd = None if ssd_dir is None else SsdStore(ssd_dir, ssd_bytes, layout, mlx_buffers)
        self.writes = WritePolicy(
            self.ram,
            self.ssd,
            quiet_s=quiet_s,
            idle_s=idle_s,
            max_queued_writes=max_queued_writes,
        )
        self.ssd_hits = 0
        self.read_ahead = {"entries": 0, "bytes": 0, "done": 0}  # read_ahead.py's tally
        self.reply_splices = 0  # prompts that got a reply's generated ids back (replies.py)

    def start(self) -> None:
        """Scan the SSD tier (it may turn itself off) and start its writer. Never raises."""
        if self.ssd is None:
            return
        if self.ssd.layout is None:  # nothing could check an entry's shapes: use none
            self.ssd.disable(
                "no KV layout to check entries against (a cache type the SSD"
                " tier cannot hold, or the probe failed)"
            )
        try:
            found = self.ssd.scan() if self.ssd.disabled is None else 0
        except Exception as exc:  # a bug in the scan must not cost the worker its start
            log.exception("SSD prompt cache scan failed")
            self.ssd.disable(f"scan failed: {exc}")
            found = 0
        if self.ssd.disabled is None:
            left = self.ssd.leftovers
            log.info(
                "SSD prompt cache at %s: %d entries, %d bytes; %d leftover files removed"
                " (%d too recent to tell from a write in progress: removed later if left)",
                self.ssd.dir,
                found,
                self.ssd.nbytes,
                left.removed,
                len(left.waiting),
            )
        writer = self.writes.writer
        assert writer is not None  # made together with the SSD tier
        writer.start()  # also when off: queued writes then resolve at once, as failed

    # -- any thread -------------------------------------------------------------------------
    def ssd_candidate(self, ns: str, prompt: list[int]) -> SsdEntry | None:
        """An SSD entry covering at least `earn_tokens` more of `prompt` than RAM does, if any:
        a restore reads a whole file, worth it to save a real prefill, not a shared template."""
        if self.ssd is None:
            return None
        e, n = self.ssd.best(ns, prompt)
        return e if e is not None and n - self.ram.peek(ns, prompt) >= self.earn_tokens else None

    def near(self, ns: str, prompt: list[int], limit: int = 4) -> list[tuple[tuple, tuple]]:
        """(tokens, replies) of up to `limit` entries with replies sharing a prefix with
        `prompt`, RAM's first, then the SSD tier's."""
        out = [(e.tokens, e.replies) for e in self.ram.near(ns, prompt, limit)]
        if self.ssd is not None and len(out) < limit:
            out += [(e.tokens, e.replies) for e in self.ssd.near(ns, prompt, limit - len(out))]
        return out

    def read_ssd(self, e: SsdEntry, use: bool = True) -> dict[str, np.ndarray] | None:
        return self.ssd.read(e, use) if self.ssd is not None else None

    # -- engine thread ----------------------------------------------------------------------
    def fetch(
        self, ns: str, prompt: list[int], restored: tuple[SsdEntry, dict] | None = None
    ) -> tuple[list | None, int, str]:
        """Caches for the longest reusable prefix and where they came from; in whole prefill
        blocks when those are on (worker/model/blocks.py, CUDA)."""
        if restored is not None and self.ssd is not None:
            try:
                hit = self._restore(ns, prompt, *restored)
            except Exception as exc:  # an entry that cannot be used: drop it, run as a miss
                self.ssd.discard(restored[0], exc)
                hit = None
            if hit is not None:
                layers, n = aligned_hit(hit[0], hit[1])
                return layers, n, hit[2]
        layers, n = aligned_hit(*self.ram.fetch(ns, prompt))
        return layers, n, "ram" if layers is not None else "none"

    def _restore(
        self, ns: str, prompt: list[int], e: SsdEntry, arrays: dict
    ) -> tuple[list, int, str] | None:
        if self.ram.peek(ns, prompt) >= len(e.tokens):
            return None
        layers, layout = self._layers(e, arrays)
        self.ssd_hits += 1
        if self.ram.insert(ns, e.tokens, layers, e.session, True, replies=e.replies) is None:
            # Too large to keep in RAM: serve this request straight from the restore.
            common = common_prefix(e.tokens, prompt)
            n = usable_length(len(e.tokens), common, len(prompt), trims(layout), False)
            return view(layers, n, len(e.tokens)), n, "ssd"
        return None

    def warm(self, e: SsdEntry, arrays: dict) -> bool:
        """Put a read SSD entry into the RAM tier ahead of any request (read_ahead.py): False
        when RAM already covers it or has no room for it (nothing is evicted for it)."""
        if self.ram.covers(e.ns, e.tokens) or self.ram.cap_bytes - self.ram.nbytes < e.file_bytes:
            return False
        layers, _ = self._layers(e, arrays, device_copy=device_copies())
        # A guess: evicted before anything a request used (ram.py).
        entry = self.ram.insert(
            e.ns, e.tokens, layers, e.session, True, replies=e.replies, guess=True
        )
        return entry is not None

    def _layers(self, e: SsdEntry, arrays: dict, device_copy: bool = False) -> tuple[list, Layout]:
        """The caches of a read entry, its shapes checked again (the arrays may be shared);
        `device_copy`: kv_arrays.from_numpy's."""
        assert self.ssd is not None  # only entries of the SSD tier come here
        layout = self.ssd.layout
        if layout is None:
            raise LayoutMismatch("no layout to check the entry against")
        check_layout(arrays, layout, len(e.tokens))
        return from_numpy(arrays, layout, device_copy), layout

    def store(
        self,
        ns: str,
        tokens: tuple[int, ...],
        layers: list,
        session: str | None = None,
        cached: int = 0,
        replies: tuple[Reply, ...] = (),
    ) -> None:
        """Keep a row's state. `cached` of its prompt tokens came from the cache: at least
        `earn_tokens` is a real reuse, which earns the entry its SSD write. `replies`: the
        generated ids among `tokens`, for the next turn to splice back (replies.py)."""
        if self.ram.cap_bytes <= 0 and self.ssd is None:
            return
        layers = compact(layers)
        hits = int(cached >= self.earn_tokens)
        replies = clip(replies, len(tokens))
        inserted = self.ram.insert(ns, tokens, layers, session, hits=hits, replies=replies)
        if inserted is None and self.ssd is not None:
            # Too large for RAM (or RAM disabled): straight to the SSD tier, if it earned that.
            nbytes = sum(c.nbytes for c in layers)
            e = Entry(ns, tokens, layers, nbytes, session, hits=hits, replies=replies)
            if e.earned:  # in place: it never enters RAM, nothing uses it on the device
                self.writes.enqueue(e, in_place=True)

    def close_session(self, session: str) -> int:
        n = self.ram.drop_session(session)
        if self.ssd is not None:
            n += self.ssd.drop_session(session)
        return n

    def stats(self) -> dict:
        r, writes = self.ram, self.writes
        out = {
            "cache_ram_entries": len(r),
            "cache_ram_bytes": r.nbytes,
            "cache_ram_cap_bytes": r.cap_bytes,
            "cache_ram_hits": r.stats["hits"],
            "cache_ram_misses": r.stats["misses"],
            "cache_ram_evictions": r.stats["evictions"],
            "cache_hit_tokens": r.stats["hit_tokens"],
            "cache_spills": writes.spills,
            "cache_demotions": writes.demotions,
            "cache_reply_splices": self.reply_splices,
            **{f"cache_read_ahead_{k}": n for k, n in self.read_ahead.items()},
        }
        if self.ssd is not None:
            s, w = self.ssd.stats, writes.writer
            assert w is not None  # made together with the SSD tier
            out.update(
                {
                    "cache_ssd_entries": len(self.ssd),
                    "cache_ssd_bytes": self.ssd.nbytes,
                    "cache_ssd_cap_bytes": self.ssd.cap_bytes,
                    "cache_ssd_hits": self.ssd_hits,
                    "cache_ssd_restores": s["restores"],
                    "cache_ssd_writes": s["writes"],
                    "cache_ssd_written_bytes": s["bytes_written"],
                    **{f"cache_ssd_written_{r}": n for r, n in writes.written.items()},
                    "cache_ssd_corrupt": s["corrupt"],
                    "cache_ssd_leftovers_removed": self.ssd.leftovers.removed,
                    "cache_ssd_evictions": s["evictions"],
                    "cache_write_drops": w.dropped,
                    "cache_write_pending": w.pending,
                    "cache_write_failed": w.failed,
                    "cache_ssd_errors": self.ssd.errors,
                    "cache_ssd_disabled": int(self.ssd.disabled is not None),
                    "cache_ssd_rejected": s["rejected"],
                    "cache_ssd_read_errors": s["read_errors"],
                    "cache_ssd_write_errors": s["write_errors"],
                }
            )
        return out
