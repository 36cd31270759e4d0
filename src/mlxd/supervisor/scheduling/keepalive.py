"""Keep-alive: a model idle past its keep_alive_s is unloaded (0: as soon as it is idle,
-1: never); a pinned model never is. The timer starts when the model's last lease ends.
A request may set the model's keep-alive for after it (Ollama's keep_alive: ModelSlot's
`keep_alive_s`)."""

from __future__ import annotations

import asyncio

from mlxd.supervisor.lifecycle.owner import Lifecycle
from mlxd.supervisor.lifecycle.slot import ModelSlot
from mlxd.supervisor.lifecycle.states import State

TICK_S = 0.5  # how often idle models are looked at


def on_idle(lc: Lifecycle, slot: ModelSlot) -> None:
    """The last lease on `slot` ended: keep_alive 0 unloads it now."""
    if slot.keep_alive_s == 0 and not slot.settings.pinned:
        lc.tasks.spawn(lc.unload_slot(slot, "keep_alive 0", only_if_idle=True))


async def unload_when_idle(lc: Lifecycle, slot: ModelSlot) -> None:
    """A request to unload (Ollama's keep_alive 0 without a prompt): at once if the model is
    idle, else as its last lease ends. A pinned model stays."""
    slot.requested_keep_alive_s = 0.0
    if slot.leases == 0 and not slot.settings.pinned:
        await lc.unload_slot(slot, "keep_alive 0", only_if_idle=True)


def granted_keep_alive(
    requested_s: float | None, configured_s: float, may_shorten: bool
) -> float | None:
    """The keep-alive a request's own keep_alive gets (None: the model's configured one).

    One that would unload the model sooner than `configured_s` (0 included) needs
    `may_shorten` (an admin caller, or api_keep_alive_unloads): otherwise any API key holder
    could force reloads on everyone. A longer one (-1: for good) is anyone's: eviction still
    frees memory when it is needed."""
    if requested_s is None or may_shorten or requested_s < 0:
        return requested_s
    if configured_s < 0 or requested_s < configured_s:
        return None
    return requested_s


def expired(lc: Lifecycle, now: float) -> list[ModelSlot]:
    """READY models idle (no lease) for at least their keep-alive at `now`."""
    return [
        slot
        for slot in lc.slots.values()
        if slot.state is State.READY
        and slot.leases == 0
        and slot.keep_alive_s >= 0
        and not slot.settings.pinned
        and now - slot.last_used >= slot.keep_alive_s
    ]


def sweep(lc: Lifecycle) -> None:
    """Unload (in the background) every model whose keep-alive ran out."""
    for slot in expired(lc, lc.clock()):
        ka = slot.keep_alive_s
        lc.tasks.spawn(lc.unload(slot.id, reason=f"idle {ka:.0f}s (keep_alive)", only_if_idle=True))


async def run_keepalive(lc: Lifecycle, tick_s: float = TICK_S) -> None:
    """Forever: unload models idle past their keep-alive."""
    while True:
        await asyncio.sleep(tick_s)
        sweep(lc)
