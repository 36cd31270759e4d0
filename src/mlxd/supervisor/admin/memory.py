"""GET /admin/memory: the memory budget, each running worker's share, the eviction order."""

from __future__ import annotations

import orjson
from aiohttp import web

from mlxd.shared.wire.admin import MemoryModel, MemoryReport
from mlxd.supervisor.admin.views import worker_rss_bytes
from mlxd.supervisor.lifecycle.admission import residents
from mlxd.supervisor.lifecycle.states import RUNNING
from mlxd.supervisor.policy.eviction import eviction_candidates
from mlxd.supervisor.registry.registry import Registry


def memory_report(reg: Registry) -> MemoryReport:
    """What the budget holds now, as the admission and eviction policy see it."""
    lc = reg.lifecycle
    now = lc.clock()
    res = residents(lc, "")  # no model is loading: every idle ready one is a candidate
    order = [r.id for r in eviction_candidates(res)]
    slots = [s for s in [*lc.slots.values(), *lc.incoming, *lc.retired] if s.state in RUNNING]
    rows = [
        MemoryModel(
            id=s.id,
            state=s.state.value,
            footprint_bytes=s.footprint_bytes,
            memory=s.memory,
            memory_bytes=worker_rss_bytes(s),
            leases=s.leases,
            pinned=s.settings.pinned,
            idle_s=None if s.started_at == 0.0 else round(max(0.0, now - s.last_used), 3),
            evictable=s.id in order,
        )
        for s in slots
    ]
    used = sum(s.footprint_bytes for s in slots)
    return MemoryReport(
        budget_bytes=lc.budget_bytes,
        used_bytes=used,
        free_bytes=max(0, lc.budget_bytes - used),
        max_loaded_models=lc.settings.max_loaded_models,
        models=rows,
        eviction_order=order,
    )


async def get_memory(request: web.Request) -> web.Response:
    report = memory_report(request.app["registry"])
    return web.Response(
        body=orjson.dumps(report.model_dump(mode="json")), content_type="application/json"
    )


def add_memory_route(app: web.Application) -> None:
    app.router.add_get("/admin/memory", get_memory)
