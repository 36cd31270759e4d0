"""Periodic duties: keep-alive unloads of idle models and the health watchdog."""

from __future__ import annotations

import asyncio
import logging

from .registry import Registry
from .states import State

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
            if (slot.leases == 0 and ka >= 0 and not slot.settings.pinned
                    and now - slot.last_used >= ka):
                reg.spawn_task(reg.unload(slot.id, reason=f"idle {ka:.0f}s (keep_alive)",
                                          only_if_idle=True))
        if now - last_health >= reg.settings.health_interval_s:
            last_health = now
            for slot in [s for s in reg.slots.values() if s.state is State.READY]:
                reg.spawn_task(check_health(reg, slot))


async def check_health(reg: Registry, slot) -> None:
    """One watchdog probe; a worker silent for watchdog_timeout_s is killed (then restarted)."""
    timeout_s = min(reg.settings.health_interval_s, reg.settings.watchdog_timeout_s)
    try:
        status, _ = await reg.upstream.get_json(slot.socket, "/health", timeout_s)
        if status == 200:
            slot.last_health_ok = reg.clock()
            return
    except Exception:
        pass
    silent_s = reg.clock() - slot.last_health_ok
    if silent_s >= reg.settings.watchdog_timeout_s and slot.process is not None \
            and slot.state is State.READY:
        log.error("watchdog: model=%s silent for %.0fs, killing pid=%s", slot.id, silent_s,
                  slot.process.pid)
        slot.process.kill()
