"""The supervisor's public HTTP routes: health, model listing, and the /v1 proxy."""

from __future__ import annotations

import logging
import time

import orjson
from aiohttp import web

from mlxd import __version__
from mlxd.shared.errors import BadRequest, ModelNotFound
from mlxd.shared.logs import bind_log_context
from mlxd.shared.routes import FORWARDED_PATHS
from mlxd.shared.wire.bodies import load_json
from mlxd.shared.wire.openai_out import ModelCard, ModelList
from mlxd.supervisor.catalog.cards import card_fields, check_route
from mlxd.supervisor.catalog.discovery import ModelEntry
from mlxd.supervisor.http.audio import add_audio_routes
from mlxd.supervisor.http.ollama import add_ollama_routes
from mlxd.supervisor.http.proxy import ADAPTER, forward_leased
from mlxd.supervisor.lifecycle.states import State
from mlxd.supervisor.registry.adapters import adapter_ids, check_mounted
from mlxd.supervisor.registry.registry import Registry
from mlxd.supervisor.ui.routes import page_response, wants_html

log = logging.getLogger("mlxd.routes")

STATUS = {  # the lifecycle state as /v1/models shows it
    State.STOPPED: "available",
    State.STARTING: "loading",
    State.READY: "loaded",
    State.DRAINING: "loaded",
    State.STOPPING: "loaded",
    State.BACKOFF: "failed",
    State.FATAL: "failed",
}
STARTED = int(time.time())
# What /v1/models says of a failed model; the exit details (worker log lines) stay in /admin.
FAILURE = {
    State.BACKOFF: "The model's worker stopped unexpectedly; it is being restarted",
    State.FATAL: "The model failed to start repeatedly; an operator can see why in /admin "
    "and reload it",
}


def _json(data, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


async def health(request: web.Request) -> web.Response:
    return _json({"status": "ok", "version": __version__})


def _card(reg: Registry, model_id: str, entries: dict[str, ModelEntry]) -> dict:
    slot = reg.lifecycle.slots.get(model_id)
    status = STATUS[slot.state] if slot else "available"
    entry = slot.entry if slot else entries[model_id]
    fields = card_fields(entry, reg.settings)
    card = ModelCard(id=model_id, created=STARTED, status=status, **fields).model_dump()
    if slot and slot.state in FAILURE:
        card["error"] = FAILURE[slot.state]
    return card


async def list_models(request: web.Request) -> web.Response:
    reg: Registry = request.app["registry"]
    entries = reg.catalog.entries()
    ids = sorted(set(entries) | set(reg.lifecycle.slots))
    cards = []
    for i in ids:
        card = _card(reg, i, entries)
        cards.append(card)
        # Each LoRA adapter is a model a client may name; it runs on its base's worker.
        for mid, name in adapter_ids(reg, i).items():
            cards.append({**card, "id": mid, "base": i, "adapter": name})
    return _json({**ModelList(data=[]).model_dump(), "data": cards})


async def get_model(request: web.Request) -> web.Response:
    reg: Registry = request.app["registry"]
    model_id = request.match_info["model_id"]
    entries = reg.catalog.entries()
    if model_id not in reg.lifecycle.slots and model_id not in entries:
        raise ModelNotFound(model_id, reg.catalog.known_names())
    return _json(_card(reg, model_id, entries))


async def proxy_v1(request: web.Request) -> web.StreamResponse:
    """A known /v1 POST (FORWARDED_PATHS) goes to the worker of the model its body names."""
    reg: Registry = request.app["registry"]
    body = await request.read()
    data = load_json(body)
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("Invalid 'model': must be a string", param="model")
    await reg.catalog.settle(model)
    entry, request[ADAPTER] = reg.catalog.route(model, data.get("adapter"))
    request["model"] = entry.id  # the metrics label, also when the lease fails
    check_mounted(reg, entry.id, request[ADAPTER])
    bind_log_context(model=entry.id)  # and every log line from here on
    check_route(entry, reg.settings, request.path)  # a wrong kind of model loads nothing
    if model != entry.id and not request[ADAPTER]:  # the default model was chosen: tell it
        data["model"] = entry.id
        body = orjson.dumps(data)
    log.info("proxy model=%s path=%s request_id=%s", entry.id, request.path, request["request_id"])
    return await forward_leased(request, reg, entry.id, body)


async def root(request: web.Request) -> web.Response:
    """HEAD / and GET / are 200, as Ollama answers them: Claude Code probes the base URL with
    HEAD before its first request, Ollama clients GET it to see that a server runs.
    A browser (Accept prefers text/html) gets the dashboard instead."""
    if request.method == "GET" and wants_html(request.headers.get("Accept", "")):
        return page_response()
    return web.Response(text="Ollama is running")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/health", health)
    app.router.add_get("/", root)  # and HEAD /, which aiohttp routes to the same handler
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model_id:.+}", get_model)
    for path in FORWARDED_PATHS:  # by name: nothing else under /v1 reaches a worker
        app.router.add_post(path, proxy_v1)
    add_audio_routes(app)
    add_ollama_routes(app)
