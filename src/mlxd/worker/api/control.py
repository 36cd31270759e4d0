"""The worker's own routes for its supervisor: health, stats, drain, cache flush, session close.

Also GET /v1/models (the one model this worker serves)."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import orjson
from aiohttp import web

from mlxd.shared.errors import BadRequest
from mlxd.shared.wire.admin import WorkerHealth
from mlxd.shared.wire.bodies import load_json
from mlxd.shared.wire.openai_out import ModelCard, ModelList
from mlxd.shared.worker_spec import WorkerSpec
from mlxd.worker.chat.state import WorkerState
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.stats import model_memory

log = logging.getLogger("mlxd.worker")


def _json(data, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


async def health(request: web.Request) -> web.Response:
    """200 only while this worker serves; pid and generation let the supervisor check that
    the process on its socket is the one it started."""
    state: WorkerState = request.app["state"]
    cfg = state.config
    status, error = "ok", None
    if state.loaded is None or not state.started:
        status = "loading"
    elif state.engine is not None and state.engine.dead is not None:
        # Unhealthy on purpose: the supervisor's watchdog then restarts this worker.
        status, error = "failed", state.engine.dead
    elif state.draining:
        status = "draining"  # admits nothing: routing must not count it as serving
    body = WorkerHealth(
        status=status, pid=os.getpid(), generation=cfg.generation, model=cfg.model_id, error=error
    )
    if status == "loading":
        body.phase = state.phase
    if state.started and state.engine is not None:
        body.memory = model_memory(state.engine)
        body.memory_in_use_bytes = body.memory.total_bytes
        plan = state.engine.memory_plan
        body.memory_limit_bytes = plan.total_bytes if plan else None
    return _json(body.model_dump(exclude_none=True), status=200 if status == "ok" else 503)


async def models(request: web.Request) -> web.Response:
    state: WorkerState = request.app["state"]
    cfg: WorkerSpec = state.config
    kind = state.facts.type if state.facts is not None else None
    card = ModelCard(id=cfg.model_id, status="loaded", type=kind)
    return _json(ModelList(data=[card]).model_dump())


async def stats(request: web.Request) -> web.Response:
    state: WorkerState = request.app["state"]
    body = {
        "model": state.config.model_id,
        "loaded": state.loaded is not None,
        "draining": state.draining,
    }
    if state.engine is not None:
        body.update(state.engine.stats())
    return _json(body)


async def drain(request: web.Request) -> web.Response:
    """Stop admitting; let in-flight rows finish until the deadline, then cancel the rest."""
    state: WorkerState = request.app["state"]
    _, engine = state.ready()
    state.draining = True
    in_flight = engine.active_rows + engine.queued_rows
    cancelled_before = engine.cancellations
    await wait_rows(engine, state.config.grace_s)
    cancelled = engine.cancel_all()
    await wait_rows(engine, 5.0)
    persisted = await persist(state)
    body = {
        "status": "drained",
        "in_flight": in_flight,
        "cancelled": cancelled,
        "cancellations": engine.cancellations - cancelled_before,
        **persisted,
    }
    log.info("drained model=%s %s", state.config.model_id, body)
    return _json(body)


async def persist(state: WorkerState) -> dict:
    """Write every RAM cache entry to the SSD tier and make it durable.

    `cache_persisted` is true only when every write that ended meanwhile landed and the final
    fsync succeeded: a full disk or a tier turned off reports false, with the counts."""
    cache = state.prompt_cache
    if cache is None or cache.ssd is None or state.engine is None:
        return {"cache_persisted": False}
    written0, failed0 = cache.writes.tally()
    try:
        queued = state.engine.persist_cache()
        await asyncio.to_thread(queued.wait, 30.0)
        durable = await asyncio.to_thread(cache.writes.flush, 120.0)
    except Exception:  # the cache is an optimisation: a drain still answers
        log.exception("persisting the prompt cache failed")
        durable = False
    written, failed = cache.writes.tally()
    failed -= failed0
    return {
        "cache_persisted": durable and failed == 0 and cache.writes.writable,
        "cache_entries_written": written - written0,
        "cache_entries_failed": failed,
        "cache_ssd_entries": len(cache.ssd),
    }


async def cache_flush(request: web.Request) -> web.Response:
    """Make pending prompt-cache writes durable without stopping."""
    state: WorkerState = request.app["state"]
    state.ready()
    return _json({"status": "flushed", **await persist(state)})


async def cache_rescan(request: web.Request) -> web.Response:
    """Index SSD entries written since this worker started (a replaced generation's drain)."""
    state: WorkerState = request.app["state"]
    state.ready()
    cache = state.prompt_cache
    if cache is None or cache.ssd is None:
        return _json({"status": "rescanned", "cache_entries_added": 0})
    added = await asyncio.to_thread(cache.ssd.rescan)
    log.info("prompt cache rescan model=%s added=%d", state.config.model_id, added)
    return _json({"status": "rescanned", "cache_entries_added": added})


async def cache_session_close(request: web.Request) -> web.Response:
    """Drop a session's prompt-cache entries (RAM and SSD)."""
    state: WorkerState = request.app["state"]
    _, engine = state.ready()
    data = load_json(await request.read())
    session = data.get("session_id") or data.get("prompt_cache_key")
    if not isinstance(session, str) or not session:
        raise BadRequest("Invalid 'session_id': a non-empty string is required", param="session_id")
    done = engine.close_session(session)
    await asyncio.to_thread(done.wait, 10.0)
    return _json({"status": "closed", "session_id": session})


async def wait_rows(engine: Engine, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while engine.active_rows + engine.queued_rows and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
