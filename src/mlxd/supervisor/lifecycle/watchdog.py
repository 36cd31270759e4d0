"""The health watchdog: every health_interval_s each READY worker is asked for /health.

A worker silent for watchdog_timeout_s is killed; one that says it is draining or failed
(while the supervisor did not drain it), or whose socket another process answers, is
restarted at once: left READY it would answer 503 to every request. Either way the exit
counts as a crash (backoff, then FATAL if it keeps happening). A healthy answer's memory
report becomes the slot's footprint: what the budget, admission and eviction count.
"""

from __future__ import annotations

import asyncio

from mlxd.supervisor.lifecycle.health import probe
from mlxd.supervisor.lifecycle.owner import Lifecycle
from mlxd.supervisor.lifecycle.slot import ModelSlot
from mlxd.supervisor.lifecycle.states import State

# What a worker's /health says when it cannot serve though the supervisor routes to it.
UNSERVING = frozenset({"draining", "failed"})
TICK_S = 0.5  # how often the loop looks whether a round of probes is due


def probe_all(lc: Lifecycle) -> None:
    """One round: a background probe of every READY worker."""
    for slot in [s for s in lc.slots.values() if s.state is State.READY]:
        lc.tasks.spawn(check_health(lc, slot))


async def check_health(lc: Lifecycle, slot: ModelSlot) -> None:
    """One watchdog probe of a READY worker (see the module's docstring)."""
    proc = slot.process
    timeout_s = min(lc.settings.health_interval_s, lc.settings.watchdog_timeout_s)
    status, health = await probe(lc.upstream, slot, timeout_s)
    if proc is None or slot.process is not proc or slot.state is not State.READY:
        return  # the supervisor moved it meanwhile (its own drain, an unload): not a fault
    if health is not None:
        wrong = slot.identity_mismatch(health)
        if wrong is None and status == 200 and health.status == "ok":
            slot.last_health_ok = lc.clock()
            before = slot.footprint_bytes
            slot.record_health(health)  # the budget follows what the worker holds now
            if slot.footprint_bytes < before:
                lc.signal_room()  # a load waiting for room may fit now
            return
        if wrong is not None or health.status in UNSERVING:
            why = (
                f"its socket is answered by another worker ({wrong})"
                if wrong
                else f"the worker reports {health.status}"
                + (f": {health.error}" if health.error else "")
            )
            # A dead engine has nothing worth persisting: kill. Otherwise stop it gracefully.
            await lc.restart(slot, proc, why, kill=wrong is None and health.status == "failed")
            return
    silent_s = lc.clock() - slot.last_health_ok
    if silent_s >= lc.settings.watchdog_timeout_s:
        await lc.restart(slot, proc, f"silent for {silent_s:.0f}s", kill=True)


async def run_watchdog(lc: Lifecycle, tick_s: float = TICK_S) -> None:
    """Forever: a round of probes whenever health_interval_s passed since the last one."""
    last_round = 0.0
    while True:
        await asyncio.sleep(tick_s)
        now = lc.clock()
        if now - last_round >= lc.settings.health_interval_s:
            last_round = now
            probe_all(lc)
