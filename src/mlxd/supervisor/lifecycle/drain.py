"""A worker's drain: wait for its leases, then ask it to finish its rows and persist its cache."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from mlxd.supervisor.lifecycle.slot import ModelSlot
from mlxd.supervisor.lifecycle.states import State
from mlxd.supervisor.lifecycle.upstream import UpstreamPool

log = logging.getLogger("mlxd.registry")

# A worker's drain: its rows (drain_timeout_s), then cancelled rows leave (5 s), then its
# prompt cache is written and fsynced (at most 30 s to queue, 120 s to flush).
PERSIST_BUDGET_S = 160.0


async def drain_worker(
    upstream: UpstreamPool, slot: ModelSlot, drain_timeout_s: float, clock: Callable[[], float]
) -> dict:
    """The worker's drain report ({} when it has none: no drain route, or it just died).

    In-flight leases get `drain_timeout_s` to end while the slot stays DRAINING."""
    deadline = clock() + drain_timeout_s
    while slot.leases > 0 and clock() < deadline and slot.state is State.DRAINING:
        await asyncio.sleep(0.05)
    try:
        status, body = await upstream.post_json(
            slot.socket, "/admin/drain", drain_timeout_s + PERSIST_BUDGET_S
        )
        return body if status == 200 else {}
    except Exception as exc:  # a worker without a drain route, or one that just died
        log.debug("drain model=%s: %s", slot.id, exc)
        return {}


RESCAN_TIMEOUT_S = 60.0  # listing the folder and reading the new entries' metadata


async def rescan_worker(upstream: UpstreamPool, slot: ModelSlot) -> int:
    """Ask `slot`'s worker to index the SSD entries written since it started (a hot reload's
    old generation drains after the new one scanned the folder); how many it added."""
    if slot.state is not State.READY:
        return 0
    try:
        status, body = await upstream.post_json(
            slot.socket, "/admin/cache/rescan", RESCAN_TIMEOUT_S
        )
    except Exception as exc:  # the cache is an optimisation: a reload never fails for it
        log.warning("prompt cache rescan model=%s failed: %s", slot.id, exc)
        return 0
    return int(body.get("cache_entries_added", 0)) if status == 200 else 0
