"""A hot reload: a model's next generation starts beside the one serving, takes its routing
entry, and the old one drains and stops (registry/operations.py chooses hot or cold).

The slot out of routing is in the lifecycle's `incoming` while it starts (the new one) or in
its `retired` from the switch until it has stopped (the old one): memory figures, leases and
shutdown count them. Their state changes are the lifecycle owner's own verbs (load_slot,
unload_slot) and the switch is its `route`: nothing here moves a slot or writes the routing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from mlxd.shared.errors import Unavailable
from mlxd.supervisor.lifecycle.drain import rescan_worker
from mlxd.supervisor.lifecycle.slot import ModelSlot

if TYPE_CHECKING:
    from mlxd.supervisor.lifecycle.owner import Lifecycle

log = logging.getLogger("mlxd.registry")


async def hot_swap(lc: Lifecycle, old: ModelSlot, new: ModelSlot) -> None:
    """Start `new` (generation n+1) beside `old`, route to it, then drain and stop `old`."""
    lc.incoming.add(new)
    try:
        await lc.load_slot(new)
    except BaseException as exc:
        if new.process is not None and new.process.returncode is None:
            new.process.kill()
        if isinstance(exc, Exception):
            why = new.last_error or str(exc)
            raise Unavailable(
                f"Reload of '{old.id}' failed ({why}); the old worker keeps serving"
            ) from None
        raise
    finally:
        lc.incoming.discard(new)
    new.last_used = old.last_used
    new.requested_keep_alive_s = old.requested_keep_alive_s
    lc.retired.add(old)
    lc.route(new)  # requests holding `old` finish on it
    log.info(
        "model=%s hot swap: generation %d is serving, draining generation %d",
        old.id,
        new.generation,
        old.generation,
    )
    try:
        await lc.unload_slot(old, "hot reload")
        await lc.wait_settled(old)
    finally:
        lc.retired.discard(old)
    # `new` indexed the SSD tier when it started; `old` went on writing there (behind, then
    # its whole RAM cache as it drained) and evicting: `new` brings its index in line.
    added = await rescan_worker(lc.upstream, new)
    log.info(
        "model=%s hot swap: %d cache entries of generation %d indexed",
        old.id,
        added,
        old.generation,
    )
