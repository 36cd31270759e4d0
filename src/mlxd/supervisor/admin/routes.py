"""The /admin API: model status and operator actions, cache flush, stats, worker logs.

Ids may contain "/" (org/name); every id is looked up among discovered or running models
(`Catalog.resolve`), so no path is ever built from a request string.
"""

from __future__ import annotations

import asyncio
import time

import orjson
from aiohttp import web
from pydantic import BaseModel

from mlxd.shared.background import outlive_client
from mlxd.shared.errors import BadRequest
from mlxd.shared.logs import bind_log_context
from mlxd.shared.wire.admin import (
    FlushResult,
    LogTail,
    ModelAction,
    ModelStatusList,
    SessionClose,
    StatsResult,
)
from mlxd.shared.wire.bodies import load_json
from mlxd.shared.wire.ollama import model_id_of
from mlxd.supervisor.admin import logtail
from mlxd.supervisor.admin.adapters import add_adapter_routes
from mlxd.supervisor.admin.views import (
    all_model_ids,
    fan_out,
    model_detail,
    model_status,
    supervisor_stats,
)
from mlxd.supervisor.lifecycle.launch import log_path, socket_path
from mlxd.supervisor.registry.operations import APP_KEY, ops_of
from mlxd.supervisor.registry.registry import Registry
from mlxd.supervisor.store.names import NAME_TABLE

OPS = APP_KEY
ACTIONS = ("load", "unload", "drain", "reload")
FLUSH_TIMEOUT_S = 120.0  # a flush writes the RAM cache to disk: give it time
DEFAULT_TAIL = 100


def _json(body: BaseModel) -> web.Response:
    return web.Response(
        body=orjson.dumps(body.model_dump(mode="json")), content_type="application/json"
    )


def _registry(request: web.Request) -> Registry:
    return request.app["registry"]


def _model_id(request: web.Request) -> str:
    """The discovered or running model the URL names (404 otherwise)."""
    reg, model_id = _registry(request), request.match_info["model_id"]
    if model_id not in reg.lifecycle.slots:  # a running model stays reachable, folder or not
        model_id = reg.catalog.resolve(model_id).id
    request["model"] = model_id  # the metrics and log label
    bind_log_context(model=model_id)
    return model_id


async def list_models(request: web.Request) -> web.Response:
    reg = _registry(request)
    entries = reg.catalog.entries()
    rows = [model_status(reg, i, entries) for i in all_model_ids(reg, entries)]
    return _json(ModelStatusList(data=rows))


async def get_model(request: web.Request) -> web.Response:
    return _json(model_detail(_registry(request), _model_id(request)))


def _action_handler(action: str):
    async def handler(request: web.Request) -> web.Response:
        reg = _registry(request)
        model_id = _model_id(request)
        t0 = time.monotonic()
        # A background task: an admin client that hangs up must not cancel a half-done swap.
        task = reg.tasks.spawn(getattr(request.app[OPS], action)(model_id), inherit_context=True)
        result = await outlive_client(task, f"The {action} of '{model_id}'")
        slot = reg.lifecycle.slots.get(model_id)
        drained = result in ("unloaded", "drained") and slot is not None
        return _json(
            ModelAction(
                id=model_id,
                action=action,
                result=result,
                elapsed_s=round(time.monotonic() - t0, 3),
                model=model_status(reg, model_id),
                drain=slot.last_drain if drained and slot is not None else None,
            )
        )

    handler.__name__ = f"{action}_model"
    return handler


async def pull_names(request: web.Request) -> web.Response:
    """The `name:tag` table /api/pull takes besides Hugging Face ids (the dashboard's list)."""
    names = [{"name": model_id_of(n), "repo": r} for n, r in NAME_TABLE.items()]
    return web.Response(body=orjson.dumps({"names": names}), content_type="application/json")


async def flush_cache(request: web.Request) -> web.Response:
    """Ask every READY worker to flush its prompt cache; workers without the route are listed."""
    replies = await fan_out(_registry(request), "POST", "/admin/cache/flush", FLUSH_TIMEOUT_S)
    flushed = sorted(m for m, r in replies.items() if r.status == 200)
    unsupported = sorted(m for m, r in replies.items() if r.status in (404, 405))
    failed = sorted(set(replies) - set(flushed) - set(unsupported))
    return _json(
        FlushResult(flushed=flushed, unsupported=unsupported, failed=failed, workers=replies)
    )


async def close_session(request: web.Request) -> web.Response:
    """Drop a session's prompt-cache entries in every loaded worker (RAM and SSD)."""
    data = load_json(await request.read())
    session = data.get("session_id") or data.get("prompt_cache_key")
    if not isinstance(session, str) or not session:
        raise BadRequest("Invalid 'session_id': a non-empty string is required", param="session_id")
    replies = await fan_out(
        _registry(request),
        "POST",
        "/admin/cache/session/close",
        FLUSH_TIMEOUT_S,
        body={"session_id": session},
    )
    return _json(SessionClose(session_id=session, workers=replies))


async def stats(request: web.Request) -> web.Response:
    reg = _registry(request)
    return _json(
        StatsResult(supervisor=supervisor_stats(reg), workers=await fan_out(reg, "GET", "/stats"))
    )


def _int_param(request: web.Request, name: str, default: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"Invalid '{name}': must be an integer", param=name) from None
    if not 0 <= value <= high:
        raise BadRequest(f"Invalid '{name}': must be between 0 and {high}", param=name)
    return value


async def model_logs(request: web.Request) -> web.Response:
    """GET …/logs?tail=N (the last N lines) or …/logs?after=OFFSET (lines appended since)."""
    reg = _registry(request)
    model_id = _model_id(request)
    slot = reg.lifecycle.slots.get(model_id)
    socket = slot.socket if slot is not None else socket_path(reg.settings.run_dir, model_id)
    path = log_path(reg.settings.logs_dir, socket)  # the name the worker's log was given
    if "after" in request.query:
        after = _int_param(request, "after", 0, 1 << 62)
        lines, offset = await asyncio.to_thread(logtail.read_after, path, after)
    else:
        n = _int_param(request, "tail", DEFAULT_TAIL, logtail.MAX_TAIL_LINES)
        lines, offset = await asyncio.to_thread(logtail.tail, path, n)
    return _json(LogTail(id=model_id, file=path.name, lines=lines, offset=offset))


def add_admin_routes(app: web.Application) -> None:
    """Register /admin/*; the operator verbs share one ModelOps (one action per model)."""
    ops_of(app)
    r = app.router
    r.add_get("/admin/models", list_models)
    r.add_get("/admin/stats", stats)
    r.add_get("/admin/pull-names", pull_names)
    r.add_post("/admin/cache/flush", flush_cache)
    r.add_post("/admin/cache/session/close", close_session)
    r.add_get("/admin/models/{model_id:.+}/logs", model_logs)
    add_adapter_routes(app)
    for action in ACTIONS:
        r.add_post(f"/admin/models/{{model_id:.+}}/{action}", _action_handler(action))
    r.add_get("/admin/models/{model_id:.+}", get_model)
