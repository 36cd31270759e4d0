"""The supervisor's public HTTP routes: health, model listing, and the /v1 proxy."""

from __future__ import annotations

import logging
import time

import orjson
from aiohttp import web

from mlxd.shared.bodies import load_json
from mlxd.shared.errors import BadRequest, ModelNotFound
from mlxd.shared.logs import bind_log_context
from mlxd.shared.wire_openai import ModelCard, ModelList

from .proxy import forward
from .registry import Registry
from .states import State

log = logging.getLogger("mlxd.routes")

STATUS = {  # the lifecycle state as /v1/models shows it
    State.STOPPED: "available", State.STARTING: "loading", State.READY: "loaded",
    State.DRAINING: "loaded", State.STOPPING: "loaded", State.BACKOFF: "failed",
    State.FATAL: "failed",
}
STARTED = int(time.time())


def _json(data, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


async def health(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


def _card(reg: Registry, model_id: str) -> dict:
    slot = reg.slots.get(model_id)
    status = STATUS[slot.state] if slot else "available"
    card = ModelCard(id=model_id, created=STARTED, status=status).model_dump()
    if slot and slot.last_error and slot.state in (State.BACKOFF, State.FATAL):
        card["error"] = slot.last_error
    return card


async def list_models(request: web.Request) -> web.Response:
    reg: Registry = request.app["registry"]
    ids = sorted(set(reg.entries()) | set(reg.slots))
    return _json({**ModelList(data=[]).model_dump(), "data": [_card(reg, i) for i in ids]})


async def get_model(request: web.Request) -> web.Response:
    reg: Registry = request.app["registry"]
    model_id = request.match_info["model_id"]
    if model_id not in reg.slots and model_id not in reg.entries():
        raise ModelNotFound(model_id)
    return _json(_card(reg, model_id))


async def proxy_v1(request: web.Request) -> web.StreamResponse:
    """Any /v1 POST that carries `model` goes to that model's worker."""
    reg: Registry = request.app["registry"]
    body = await request.read()
    data = load_json(body)
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("Invalid 'model': must be a string", param="model")
    await reg.settle(model)
    entry = reg.resolve(model)
    request["model"] = entry.id  # the metrics label, also when the lease fails
    bind_log_context(model=entry.id)  # and every log line from here on
    if model != entry.id:  # the default model was chosen: tell the worker
        data["model"] = entry.id
        body = orjson.dumps(data)
    async with reg.lease(entry.id) as slot:
        log.info("proxy model=%s path=%s request_id=%s", slot.id, request.path,
                 request["request_id"])
        return await forward(request, slot, body, reg.upstream)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model_id:.+}", get_model)
    app.router.add_post("/v1/{tail:.+}", proxy_v1)
