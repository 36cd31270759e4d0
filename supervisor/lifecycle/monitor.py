"""Periodic duties: keep-alive unloads of idle models and the health watchdog."""

from __future__ import annotations

import asyncio
import logging

from mlxd.supervisor.lifecycle.process import WorkerProcess
from mlxd.supervisor.lifecycle.registry import Registry
from mlxd.supervisor.lifecycle.slot import ModelSlot
from mlxd.supervisor.lifecycle.states import State

# What a worker's /health says when it cannot serve though the supervisor routes to it.
UNSERVING = frozenset({"draining", "failed"})

log = logging.getLogger("mlxd.monitor")


async def run_monitor(reg: Registry, tick_s: float = 0.5) -> None:
    """Forever: unload models idle past their keep-alive; kill workers that stop answering."""
    last_health = 0.0
    while True:
        await asyncio.sleep(tick_s)
        now = reg.clock()
        for slot in list(reg.slots.values()):
            if slot.state is not State.READY:
                continue
            ka = reg.keep_alive_s(slot)
            if (
                slot.leases == 0
                and ka >= 0
                and not slot.settings.pinned
                and now - slot.last_used >= ka
            ):
                reg.spawn_task(
                    reg.unload(slot.id, reason=f"idle {ka:.0f}s (keep_alive)", only_if_idle=True)
                )
        if now - last_health >= reg.settings.health_interval_s:
            last_health = now
            for slot in [s for s in reg.slots.values() if s.state is State.READY]:
                reg.spawn_task(check_health(reg, slot))


async def check_health(reg: Registry, slot: ModelSlot) -> None:
    """One watchdog probe of a READY worker.

    A worker silent for watchdog_timeout_s is killed; one that says it is draining or failed
    (while the supervisor did not drain it), or whose socket is answered by another process,
    is restarted at once: left READY it would answer 503 to every request."""
    proc = slot.process
    timeout_s = min(reg.settings.health_interval_s, reg.settings.watchdog_timeout_s)
    try:
        status, health = await reg.upstream.health(slot.socket, timeout_s)
    except Exception:
        status, health = None, None
    if proc is None or slot.process is not proc or slot.state is not State.READY:
        return  # the supervisor moved it meanwhile (its own drain, an unload): not a fault
    if health is not None:
        wrong = slot.identity_mismatch(health)
        if wrong is None and status == 200 and health.status == "ok":
            slot.last_health_ok = reg.clock()
            return
        if wrong is not None or health.status in UNSERVING:
            why = (
                f"its socket is answered by another worker ({wrong})"
                if wrong
                else f"the worker reports {health.status}"
                + (f": {health.error}" if health.error else "")
            )
            # A dead engine has nothing worth persisting: kill. Otherwise stop it gracefully.
            await restart(reg, slot, proc, why, kill=wrong is None and health.status == "failed")
            return
    silent_s = reg.clock() - slot.last_health_ok
    if silent_s >= reg.settings.watchdog_timeout_s:
        log.error(
            "watchdog: model=%s silent for %.0fs, killing pid=%s", slot.id, silent_s, proc.pid
        )
        proc.kill()


async def restart(
    reg: Registry, slot: ModelSlot, proc: WorkerProcess, why: str, *, kill: bool = False
) -> None:
    """Take a READY slot out of routing and stop its worker; the next request restarts it.

    READY -> DRAINING first, so new requests wait for the restart instead of reaching a
    worker that refuses them; the exit then counts as a crash (backoff, then FATAL if it
    keeps happening)."""
    log.error("watchdog: model=%s pid=%s %s; restarting it", slot.id, proc.pid, why)
    slot.last_error = why
    slot.transition(State.DRAINING, f"watchdog: {why}")
    if kill:
        proc.kill()
    else:
        await proc.stop(reg.settings.stop_timeout_s)
