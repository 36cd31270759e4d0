"""The supervisor's models, wired together: what exists, what runs, who holds it.

`Registry` only assembles the parts and orders the shutdown; the behaviour lives in them:
catalog/catalog.py (which models exist), lifecycle/owner.py (every state change: load, reap,
stop, reload, shutdown), lifecycle/leases.py (requests' leases and the queue),
lifecycle/tasks.py (background work). The app holds one Registry as app["registry"].
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from mlxd.shared.background import Background
from mlxd.shared.config import Settings
from mlxd.supervisor.catalog.catalog import Catalog
from mlxd.supervisor.lifecycle.group import spawn_worker
from mlxd.supervisor.lifecycle.owner import Lifecycle
from mlxd.supervisor.lifecycle.process import WorkerProcess
from mlxd.supervisor.lifecycle.upstream import UpstreamPool
from mlxd.supervisor.scheduling.leases import Leases


@dataclass
class Registry:
    """The catalog, the lifecycle owner and the leases over one upstream pool."""

    settings: Settings
    upstream: UpstreamPool
    tasks: Background
    catalog: Catalog
    lifecycle: Lifecycle
    leases: Leases
    machine_bytes: int = 0  # what workers plan in: the CUDA card's memory, else RAM (build)

    @classmethod
    def build(
        cls,
        settings: Settings,
        upstream: UpstreamPool,
        *,
        total_memory_bytes: int,
        card_bytes: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        spawner: Callable[..., WorkerProcess] = spawn_worker,
    ) -> Registry:
        """The parts for `settings`; clock and spawner are injectable (tests pass fakes).
        `card_bytes`: the CUDA card MLX runs on (supervisor/machine.py), the budget's ceiling
        and what workers plan in; None on a Mac or the CPU (RAM)."""
        tasks = Background()
        derived = int(total_memory_bytes * settings.memory_fraction)
        if card_bytes:
            derived = min(derived, card_bytes)
        budget_bytes = settings.memory_budget_bytes or derived
        lifecycle = Lifecycle(
            settings, upstream, tasks, budget_bytes=budget_bytes, clock=clock, spawner=spawner
        )

        def in_use(model_id: str):
            slot = lifecycle.slots.get(model_id)
            return slot.entry if slot is not None else None

        catalog = Catalog(settings, in_use=in_use)
        return cls(
            settings,
            upstream,
            tasks,
            catalog,
            lifecycle,
            Leases(lifecycle, catalog),
            card_bytes or total_memory_bytes,
        )

    async def shutdown(self) -> None:
        """Stop every worker (draining the READY ones), then the background work and the
        upstream connections (the daemon is exiting)."""
        await self.lifecycle.shutdown()
        self.tasks.cancel_all()
        await self.upstream.close_all()
