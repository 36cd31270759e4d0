"""Read-ahead: at start, the SSD tier's most recent entries read back into the RAM tier.

A model unloaded (idle, evicted, hot-swapped) or a daemon restarted comes back with its prompt
cache on the SSD only, and the first turn of each conversation then pays a restore: for
gemma3-12b's 16k-token conversation a 1.4 GB read, 0.84 s against 0.22 s for the same prompt
from RAM (H100, docs/benchmarks.md 2026-12-07). The conversations most likely to come back
first are the ones used last, so once the worker is READY it reads those entries, newest
first, into the RAM tier's free room: while the worker waits for its next request, not in
front of it. A request that wants an entry being read shares that read (keys.read_once).

Bounds: only the RAM tier's room at the time (nothing already in RAM is evicted for a guess),
only namespaces a request can reach (the base model's, mounted adapters'), one entry at a
time, and it stops when the worker drains. Entries nobody asks for leave RAM as any idle
entry does (demotion after `cache_idle_s`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from mlxd.worker.cache.format import SsdEntry

log = logging.getLogger("mlxd.worker.cache")


def pick(entries: Iterable[SsdEntry], room_bytes: int) -> list[SsdEntry]:
    """The entries to read, newest first, while their files fit `room_bytes` together (an
    entry too large for what is left is skipped; an older, smaller one may still fit)."""
    out: list[SsdEntry] = []
    for e in sorted(entries, key=lambda e: e.last_used, reverse=True):
        if e.file_bytes <= room_bytes:
            out.append(e)
            room_bytes -= e.file_bytes
    return out


class _Warm:
    """An engine-thread job: put one read entry into the RAM tier (engine/commands.py)."""

    def __init__(self, cache, entry: SsdEntry, arrays: dict, loop: asyncio.AbstractEventLoop):
        self.cache, self.entry, self.arrays, self.loop = cache, entry, arrays, loop
        self.done: asyncio.Future[bool] = loop.create_future()

    def _answer(self, ok: bool) -> None:
        def answer() -> None:
            if not self.done.done():  # cancelled: the worker is stopping
                self.done.set_result(ok)

        try:
            self.loop.call_soon_threadsafe(answer)
        except RuntimeError:  # the loop is closed: nobody is waiting
            pass

    def run(self, stream: Any) -> None:
        try:
            ok = self.cache.warm(self.entry, self.arrays)
        except Exception as exc:  # an entry that cannot be used is dropped, as a restore's
            self.cache.ssd.discard(self.entry, exc)
            ok = False
        self._answer(ok)

    def fail(self, err) -> None:
        self._answer(False)


async def read_ahead(state, read_once) -> None:
    """Read the newest SSD entries into the RAM tier's room (`read_once`: keys.read_once,
    which shares a read with requests that want the same entry). Never raises."""
    cache, engine = state.prompt_cache, state.engine
    if cache is None:
        return
    if cache.ssd is None or cache.ssd.disabled is not None:
        cache.read_ahead["done"] = 1
        return
    t0 = time.monotonic()
    # Only namespaces a request can reach now: the base model's and each mounted adapter's.
    mounted = list(engine.adapters.mounted.values()) if engine.adapters is not None else []
    names = {state.cache_ns, *(state.cache_ns + m.cache_ns for m in mounted)}
    entries = [e for e in cache.ssd.index.entries() if e.ns in names]
    chosen = pick(entries, cache.ram.cap_bytes - cache.ram.nbytes)
    loop = asyncio.get_running_loop()
    for e in chosen:
        if state.draining or cache.ram.cap_bytes - cache.ram.nbytes < e.file_bytes:
            break
        if cache.ram.covers(e.ns, e.tokens):  # a request brought it (or more) back already
            continue
        try:
            arrays = await read_once(cache, e, use=False)
            if arrays is None:  # gone or damaged meanwhile (the store dropped it)
                continue
            job = _Warm(cache, e, arrays, loop)
            engine.run_job(job)
            if await job.done:
                cache.read_ahead["entries"] += 1
                cache.read_ahead["bytes"] += e.file_bytes
        except Exception:  # an optimisation: whatever fails, the requests still restore
            log.exception("SSD read-ahead of entry %s failed", e.key)
    cache.read_ahead["done"] = 1
    if chosen:
        log.info(
            "SSD read-ahead: %d of %d entries (%d bytes) into the RAM tier in %.2f s",
            cache.read_ahead["entries"],
            len(chosen),
            cache.read_ahead["bytes"],
            time.monotonic() - t0,
        )
