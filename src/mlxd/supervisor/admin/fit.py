"""GET /admin/fit?model=ID: what fits of a model on this machine, per KV scheme, and its worker.

Runs the worker's memory plan (shared/memory_plan.py) from what the supervisor knows without
MLX: the model folder's config.json (its layers' caches per family, shared/kv_config.py;
dtype), its weight files, the settings (budget, prompt-cache cap, context_limit, kv_bits) and
the machine's RAM. A running worker's own figures (its /stats: KV dtype, the KV cost it
measured from its caches, budget, reservations) are added under `loaded`; its float width is
the one the report uses (a CPU worker computes in float32 whatever the folder says) and its
measured cost replaces the config's for its scheme.
"""

from __future__ import annotations

import json

import orjson
from aiohttp import web

from mlxd.shared.errors import BadRequest
from mlxd.shared.fit import FLOAT_BITS, dtype_bytes_of, fit_schemes
from mlxd.shared.kv_config import KvLayer, KvLayout
from mlxd.shared.kv_math import KvCost
from mlxd.shared.memory_plan import plan_memory
from mlxd.shared.wire.admin import FitLoaded, FitReport
from mlxd.supervisor.admin.views import worker_rss_bytes
from mlxd.supervisor.catalog.cards import context_length, facts_of
from mlxd.supervisor.catalog.discovery import draft_weights_bytes
from mlxd.supervisor.lifecycle.slot import ModelSlot
from mlxd.supervisor.lifecycle.states import RUNNING, State
from mlxd.supervisor.registry.registry import Registry

DEFAULT_CONTEXT = 32768  # what a worker serves when config.json names no context
STATS_TIMEOUT_S = 5.0
GiB = 1024**3


def prompt_cache_cap(settings, machine_bytes: int) -> int:
    """The RAM prompt-cache cap a worker starts with (worker/assemble.py's ram_cache_bytes):
    `machine_bytes` is the CUDA card's memory there (supervisor/machine.py), else RAM."""
    if settings.prompt_cache_bytes is not None:
        return settings.prompt_cache_bytes
    return min(machine_bytes // 8, 16 * GiB)


async def _worker_stats(reg: Registry, slot: ModelSlot) -> dict:
    if slot.state is not State.READY:
        return {}
    try:
        status, body = await reg.upstream.get_json(slot.socket, "/stats", STATS_TIMEOUT_S)
    except Exception:  # a worker that just died or hangs: the report goes on without it
        return {}
    return body if status == 200 and isinstance(body, dict) else {}


def _loaded(slot: ModelSlot, stats: dict) -> FitLoaded:
    bits = stats.get("kv_bits", FLOAT_BITS) if stats else None
    memory = slot.memory  # what every other view shows, not this moment's /stats
    return FitLoaded(
        state=slot.state.value,
        footprint_bytes=memory.total_bytes,
        reported=memory.reported,
        memory=memory,
        memory_bytes=worker_rss_bytes(slot),
        memory_limit_bytes=stats.get("memory_limit_bytes"),
        kv_bits=FLOAT_BITS if stats and bits is None else bits,
        kv_bytes_per_token=stats.get("kv_bytes_per_token"),
        kv_windowed_bytes_per_token=stats.get("kv_windowed_bytes_per_token"),
        kv_window=stats.get("kv_window"),
        kv_state_bytes_per_row=stats.get("kv_state_bytes_per_row"),
        kv_budget_bytes=stats.get("kv_budget_bytes"),
        kv_reserved_bytes=memory.kv_reserved_bytes,
        rows_active=stats.get("rows_active"),
    )


async def fit_report(reg: Registry, model: str, machine_bytes: int) -> FitReport:
    """The report for `model` (ModelNotFound: 404; a folder without KV facts: 400)."""
    settings, lc = reg.settings, reg.lifecycle
    entry = reg.catalog.resolve(model)
    facts, ms = facts_of(entry, settings), settings.for_model(entry.id)
    try:
        config = json.loads((entry.path / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    layout = KvLayout.of_config(config)
    if layout is None or facts.type == "embedding":
        raise BadRequest(
            f"The model '{entry.id}' has no KV cache to plan (an embedding model, or a"
            " config.json without layer and head counts)",
            param="model",
            code="no_kv_cache",
        )
    slot = lc.slots.get(entry.id)
    running = slot is not None and slot.state in RUNNING
    stats = await _worker_stats(reg, slot) if running and slot is not None else {}
    dtype_bytes = int(stats.get("kv_dtype_bytes") or dtype_bytes_of(config))
    measured = KvCost.of_report(stats)
    full, windowed, state = layout.counts()
    first = next(iter(layout.attention), KvLayer())  # a Mamba-only model has none
    others = sum(
        s.footprint_bytes for s in lc.slots.values() if s.state in RUNNING and s.id != entry.id
    )
    plan = plan_memory(
        machine_bytes=machine_bytes,
        share_bytes=lc.budget_bytes,
        weights_bytes=entry.weights_bytes + draft_weights_bytes(ms),  # a draft loads beside it
        prompt_cache_bytes=prompt_cache_cap(settings, machine_bytes),
        kv_budget_bytes=settings.kv_budget_bytes or None,  # 0 bounds rows by batch only
    )
    context = context_length(facts, settings, entry.id) or DEFAULT_CONTEXT
    return FitReport(
        model=entry.id,
        context_length=context,
        batch=ms.batch,
        kv_bits=ms.kv_bits or FLOAT_BITS,
        kv_group_size=ms.kv_group_size,
        kv_dtype_bytes=dtype_bytes,
        layers=len(layout.layers),
        kv_heads=first.kv_heads,
        head_dim=first.k_dim,
        attention_layers=full,
        window_layers=windowed,
        state_layers=state,
        machine_memory_bytes=machine_bytes,
        budget_bytes=lc.budget_bytes,
        free_bytes=max(0, lc.budget_bytes - others),
        weights_bytes=entry.weights_bytes,
        prompt_cache_bytes=plan.prompt_cache_bytes,
        headroom_bytes=plan.headroom_bytes,
        kv_budget_bytes=plan.kv_budget_bytes,
        schemes=fit_schemes(
            layout,
            plan,
            dtype_bytes=dtype_bytes,
            context=context,
            group_size=ms.kv_group_size,
            measured={stats.get("kv_bits") or FLOAT_BITS: measured} if measured else None,
        ),
        loaded=_loaded(slot, stats) if running and slot is not None else None,
    )


async def get_fit(request: web.Request) -> web.Response:
    model = request.query.get("model")
    if not model:
        raise BadRequest("Name a model: /admin/fit?model=ID", param="model")
    reg = request.app["registry"]
    report = await fit_report(reg, model, reg.machine_bytes)
    return web.Response(
        body=orjson.dumps(report.model_dump(mode="json")), content_type="application/json"
    )


def add_fit_route(app: web.Application) -> None:
    app.router.add_get("/admin/fit", get_fit)
