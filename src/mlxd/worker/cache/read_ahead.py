"""Read-ahead: at start, the SSD tier's most recent entries read back into the RAM tier.

A model unloaded (idle, evicted, hot-swapped) or a daemon restarted comes back with its prompt
cache on the SSD only, and the first turn of each conversation then pays a restore: for
gemma3-12b's 16k-token conversation a 1.4 GB read, 0.84 s against 0.22 s for the same prompt
from RAM (H100, docs/benchmarks.md 2026-12-07). The conversations most likely to come back
first are the ones used last, so the worker reads those entries, newest first, into the RAM
tier's free room from the moment its prompt cache and engine exist: the first read runs
beside the warm-up (seconds on a GPU), so a request that loaded the model and waits for
READY finds its conversation in RAM; later ones while the worker waits for requests, not in
front of them. A request that wants an entry being read shares that read (keys.read_once);
an entry read during the warm-up enters the RAM tier right after it (on the engine thread).
The namespaces are looked at again before each entry: adapters mounted at READY count.

Bounds: only the RAM tier's room at the time (nothing already in RAM is evicted for a guess),
only namespaces a request can reach (the base model's, mounted adapters'), one entry at a
time and only while no request is being answered (a read beside one would take the disk, the
hashing threads and the engine thread's turns from it; a read already started finishes), and
it stops when the worker drains. Entries nobody asks for leave RAM as any idle
entry does (demotion after `cache_idle_s`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from functools import partial

from mlxd.shared.errors import MlxdError
from mlxd.worker.cache.format import SsdEntry

log = logging.getLogger("mlxd.worker.cache")

QUIET_POLL_S = 0.05  # how often a paused read-ahead looks whether the requests are done


def pick(entries: Iterable[SsdEntry], room_bytes: int) -> list[SsdEntry]:
    """The entries to read, newest first, while their files fit `room_bytes` together (an
    entry too large for what is left is skipped; an older, smaller one may still fit)."""
    out: list[SsdEntry] = []
    for e in sorted(entries, key=lambda e: e.last_used, reverse=True):
        if e.file_bytes <= room_bytes:
            out.append(e)
            room_bytes -= e.file_bytes
    return out


async def read_ahead(state, read_once) -> None:
    """Read the newest SSD entries into the RAM tier's room (`read_once`: keys.read_once,
    which shares a read with requests that want the same entry). Never raises.

    An entry read goes to the engine thread to enter RAM (`engine.call`) and the next read
    begins without waiting for that: during the warm-up the engine thread takes nothing, so
    every entry that fits is read then, its bytes held against the room until it is in."""
    cache, engine = state.prompt_cache, state.engine
    if cache is None:
        return
    if cache.ssd is None or cache.ssd.disabled is not None:
        cache.read_ahead["done"] = 1
        return
    t0 = time.monotonic()
    seen: set[str] = set()
    held: list[tuple[SsdEntry, asyncio.Future]] = []  # read, not yet taken into RAM
    going = True
    while going:
        await _quiet(state, engine)
        going = _settle(cache, held, done_only=True)
        e = _next(state, cache, engine, seen, sum(h.file_bytes for h, _ in held))
        if going and e is None and not state.started and not state.draining:
            await asyncio.sleep(QUIET_POLL_S)  # adapters are mounted at READY: look again
            continue
        if not going or e is None or state.draining:
            break
        seen.add(e.key)
        try:
            arrays = await read_once(cache, e, use=False)
        except Exception:  # an optimisation: whatever fails, the requests still restore
            log.exception("SSD read-ahead of entry %s failed", e.key)
            continue
        if arrays is not None:  # None: gone or damaged meanwhile (the store dropped it)
            warm = asyncio.ensure_future(
                engine.call(partial(_warm, cache, e, arrays), "SSD read-ahead")
            )
            # Looked at even when this task is cancelled first (the worker stops): no
            # "exception never retrieved" from an engine that answered it at its exit.
            warm.add_done_callback(lambda f: f.cancelled() or f.exception())
            held.append((e, warm))
            arrays = None  # the engine call holds them until they are in RAM, no longer
    if held:
        await asyncio.wait([f for _, f in held])
        _settle(cache, held, done_only=False)
    cache.read_ahead["done"] = 1
    if seen:
        log.info(
            "SSD read-ahead: %d of %d entries (%d bytes) into the RAM tier in %.2f s",
            cache.read_ahead["entries"],
            len(seen),
            cache.read_ahead["bytes"],
            time.monotonic() - t0,
        )


def _settle(cache, held: list, done_only: bool) -> bool:
    """Count the entries the engine thread took into RAM and drop them from `held` (only
    those it has answered for, with `done_only`); False once it refused (stopped, drains)."""
    going = True
    for item in [h for h in held if h[1].done() or not done_only]:
        held.remove(item)
        e, fut = item
        try:
            if fut.result():
                cache.read_ahead["entries"] += 1
                cache.read_ahead["bytes"] += e.file_bytes
        except MlxdError:  # the engine stopped or drains: nothing more to read
            going = False
        except Exception:
            log.exception("SSD read-ahead of entry %s failed", e.key)
    return going


def _next(state, cache, engine, seen: set[str], held_bytes: int) -> SsdEntry | None:
    """The newest entry not tried yet that a request can reach (the base model's namespace,
    each mounted adapter's), that RAM does not hold already and that fits its room (less
    `held_bytes`, read and on their way in)."""
    mounted = list(engine.adapters.mounted.values()) if engine.adapters is not None else []
    names = {state.cache_ns, *(state.cache_ns + m.cache_ns for m in mounted)}
    room = cache.ram.cap_bytes - cache.ram.nbytes - held_bytes
    entries = [e for e in cache.ssd.index.entries() if e.ns in names and e.key not in seen]
    for e in pick(entries, room):
        if not cache.ram.covers(e.ns, e.tokens):
            return e
        seen.add(e.key)  # a request brought it (or more) back already
    return None


async def _quiet(state, engine) -> None:
    """Until no generating request is being answered (from its parse on: its render, its
    own SSD read) and no row is in the batch or queued for it, or the worker drains."""
    while not state.draining and (
        state.generating or engine.queued_rows or engine.rows_in_flight()
    ):
        await asyncio.sleep(QUIET_POLL_S)


def _warm(cache, e: SsdEntry, arrays: dict) -> bool:
    """On the engine thread: the read entry into the RAM tier; one that cannot be used is
    dropped, as a request's restore drops it."""
    try:
        return cache.warm(e, arrays)
    except Exception as exc:
        cache.ssd.discard(e, exc)
        return False
