"""Asking a worker's /health: one probe, and the wait until a starting worker is healthy."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from mlxd.shared.errors import Unavailable
from mlxd.shared.wire.admin import WorkerHealth
from mlxd.supervisor.lifecycle.process import WorkerProcess
from mlxd.supervisor.lifecycle.slot import ModelSlot
from mlxd.supervisor.lifecycle.upstream import UpstreamPool

log = logging.getLogger("mlxd.registry")

# Where a client is sent for a worker's failure: /v1 errors never carry it (paths, log lines).
ADMIN_HINT = "why: mlxctl ps, or GET /admin/models/{}"
POLL_S = 0.05  # how often a starting worker is asked


async def probe(
    upstream: UpstreamPool, slot: ModelSlot, timeout_s: float
) -> tuple[int | None, WorkerHealth | None]:
    """The worker's /health answer; (None, None) when it does not answer (not listening yet,
    dead, or silent past `timeout_s`)."""
    try:
        return await upstream.health(slot.socket, timeout_s)
    except Exception:
        return None, None


async def until_healthy(
    upstream: UpstreamPool,
    slot: ModelSlot,
    proc: WorkerProcess,
    clock: Callable[[], float],
    deadline: float,
) -> bool:
    """Poll until `proc` answers "ok" as `slot`'s own worker (True) or `deadline` passed
    (False). Raises Unavailable when the process exited (or the slot let go of it) first."""
    warned = False
    if slot.phase is None:
        slot.record_phase("starting the worker process", clock())
    while clock() < deadline:
        if proc.returncode is not None or slot.process is not proc:
            why = slot.public_error if slot.process is not proc else proc.exit_summary()
            raise Unavailable(
                f"Model '{slot.id}' failed to start ({why}; {ADMIN_HINT.format(slot.id)})"
            )
        if slot.socket.exists():
            status, health = await probe(upstream, slot, 2.0)
            wrong = health is not None and slot.identity_mismatch(health)
            if wrong:
                # Not our process (a stale worker on this path): never adopt it. A fresh
                # connection reaches our worker once it has bound the path.
                if not warned:
                    log.warning(
                        "model=%s socket answered by another worker (%s); not adopting it",
                        slot.id,
                        wrong,
                    )
                    warned = True
                await upstream.close(slot.socket)
            elif status == 200 and health is not None and health.status == "ok":
                slot.record_health(health)  # the budget counts the worker's report from READY
                return True
            elif health is not None and health.status == "loading" and health.phase:
                slot.record_phase(health.phase, clock())
        await asyncio.sleep(POLL_S)
    return False
