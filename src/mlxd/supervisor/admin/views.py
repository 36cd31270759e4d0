"""What /admin and /metrics report: model rows, supervisor counters, worker fan-outs."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psutil

from mlxd.shared.sampling import resolve_defaults
from mlxd.shared.wire.admin import ModelDetail, ModelStatus, SupervisorStats, WorkerReply
from mlxd.shared.worker_spec import MODEL_DEFAULT_FIELDS
from mlxd.supervisor.catalog import folder
from mlxd.supervisor.lifecycle.group import GroupProcess
from mlxd.supervisor.lifecycle.slot import ModelSlot
from mlxd.supervisor.lifecycle.states import RUNNING, State
from mlxd.supervisor.registry.adapters import adapter_ids
from mlxd.supervisor.registry.registry import Registry

STARTED = time.monotonic()


def worker_rss_bytes(slot: ModelSlot) -> int | None:
    """Resident set size of the slot's worker process (None when there is none); a worker
    group's: the sum over its ranks on this host."""
    proc = slot.process
    pid = proc.pid if proc is not None else None
    if proc is None or pid is None or proc.returncode is not None:
        return None
    pids = proc.local_pids if isinstance(proc, GroupProcess) else [pid]
    try:
        return sum(psutil.Process(p).memory_info().rss for p in pids)
    except psutil.Error:
        return None


def model_status(reg: Registry, model_id: str, entries: dict | None = None) -> ModelStatus:
    """The row for `model_id`, whether it ever ran or is only discovered."""
    entries = reg.catalog.entries() if entries is None else entries
    entry = entries.get(model_id)
    slot = reg.lifecycle.slots.get(model_id)
    ms = reg.settings.for_model(model_id)
    keep_alive = ms.keep_alive_s
    row = ModelStatus(
        id=model_id, state=State.STOPPED.value, keep_alive_s=keep_alive, pinned=ms.pinned
    )
    row.adapters = sorted(adapter_ids(reg, model_id))
    if entry is not None:
        row.source, row.path, row.weights_bytes = entry.source, str(entry.path), entry.weights_bytes
    if slot is None:
        return row
    now = reg.lifecycle.clock()
    proc = slot.process
    keep_alive = row.keep_alive_s = slot.keep_alive_s  # a request may have set it
    row.state = slot.state.value
    row.footprint_bytes = slot.footprint_bytes
    row.memory = slot.memory if slot.state in RUNNING else None
    row.pid = proc.pid if proc is not None and proc.returncode is None else None
    row.memory_bytes = worker_rss_bytes(slot)
    if isinstance(proc, GroupProcess) and row.pid is not None:
        row.ranks = [p for p in proc.pids if p is not None]
    row.leases = slot.leases
    row.queued = slot.waiting
    row.idle_s = None if slot.started_at == 0.0 else round(max(0.0, now - slot.last_used), 3)
    if slot.state is State.READY and slot.leases == 0 and keep_alive >= 0 and not ms.pinned:
        row.expires_in_s = round(max(0.0, keep_alive - (now - slot.last_used)), 3)
    row.restarts = slot.restarts
    row.last_error = slot.last_error
    row.generation = slot.generation
    row.drained = slot.drained
    if slot.state is State.STARTING:
        row.phase = slot.phase
        row.load_s = round(max(0.0, now - slot.started_at), 1)
    return row


def model_detail(reg: Registry, model_id: str) -> ModelDetail:
    """`model_status` plus the model's resolved settings and what its folder says."""
    row = model_status(reg, model_id)
    settings = reg.settings.for_model(model_id).model_dump(mode="json", exclude={"path"})
    detail = ModelDetail(
        **row.model_dump(), settings={k: v for k, v in settings.items() if v not in (None, [])}
    )
    if row.path is not None:
        path = Path(row.path)
        detail.generation_config = folder.generation_config(path)
        detail.architecture = folder.architecture(path)
        ms = reg.settings.for_model(model_id)
        section = {name: getattr(ms, name) for name in MODEL_DEFAULT_FIELDS}
        detail.sampling_defaults = resolve_defaults(path, section).flat()
    return detail


def all_model_ids(reg: Registry, entries: dict) -> list[str]:
    return sorted(set(entries) | set(reg.lifecycle.slots))


def supervisor_stats(reg: Registry) -> SupervisorStats:
    lc = reg.lifecycle
    c = lc.counters
    slots = list(lc.slots.values())
    return SupervisorStats(
        uptime_s=round(time.monotonic() - STARTED, 3),
        budget_bytes=lc.budget_bytes,
        models_loaded=sum(s.state is State.READY for s in slots),
        leases=sum(s.leases for s in [*slots, *lc.retired]),
        queued=sum(s.waiting for s in slots),
        loads=c.loads,
        load_failures=c.load_failures,
        evictions=c.evictions,
        unloads=c.unloads,
        crashes=c.crashes,
        reloads=c.reloads,
    )


async def fan_out(
    reg: Registry, method: str, path: str, timeout_s: float = 5.0, body: dict | None = None
) -> dict[str, WorkerReply]:
    """Send one request to every READY worker at once; each answer or failure by model id."""
    ready = [s for s in reg.lifecycle.slots.values() if s.state is State.READY]

    async def one(slot: ModelSlot) -> WorkerReply:
        try:
            if method == "GET":
                status, reply = await reg.upstream.get_json(slot.socket, path, timeout_s)
            else:
                status, reply = await reg.upstream.post_json(slot.socket, path, timeout_s, body)
        except Exception as exc:  # a worker that just died or hangs: report, don't fail all
            return WorkerReply(error=f"{type(exc).__name__}: {exc}".rstrip(": "))
        return WorkerReply(status=status, body=reply if isinstance(reply, dict) else {})

    replies = await asyncio.gather(*(one(s) for s in ready))
    return {s.id: r for s, r in zip(ready, replies)}
