"""The Ollama API on the supervisor's port (docs/api.md, "Ollama API").

Model listings (/api/version, /api/tags, /api/ps, /api/show) are answered from the catalog and
the lifecycle (ollama_models.py), model management (/api/pull, /api/delete, /api/copy,
/api/create) by the model store (ollama_manage.py). /api/chat and /api/generate are checked
here (a mistake is a 400 before any model loads) and forwarded to the worker's own /api
routes; a request without messages or prompt is Ollama's "load" (with keep_alive 0:
"unload"), answered here. The embeddings routes are translated to the worker's OpenAI-shaped
/v1/embeddings.
"""

from __future__ import annotations

import logging
import time

from aiohttp import web
from pydantic import ValidationError

from mlxd.shared.errors import BadGateway, BadRequest, MlxdError
from mlxd.shared.logs import bind_log_context
from mlxd.shared.routes import BY_PATH
from mlxd.shared.wire.bodies import load_json, parse_model
from mlxd.shared.wire.ollama import ChatRequest, EmbedRequest, GenerateRequest
from mlxd.shared.wire.ollama_answers import (
    ChatAnswer,
    EmbedAnswer,
    GenerateAnswer,
    WorkerEmbeddings,
)
from mlxd.supervisor.catalog.cards import check_route
from mlxd.supervisor.http.auth import Forbidden, keep_alive_for
from mlxd.supervisor.http.ollama_manage import add_manage_routes
from mlxd.supervisor.http.ollama_models import (
    entry_for,
    json_response,
    ps,
    route_for,
    show,
    tags,
    version,
)
from mlxd.supervisor.http.proxy import ADAPTER, UPSTREAM_ERRORS, forward_leased
from mlxd.supervisor.registry.adapters import check_mounted
from mlxd.supervisor.registry.registry import Registry
from mlxd.supervisor.scheduling.keepalive import unload_when_idle

log = logging.getLogger("mlxd.ollama")

# An adapter's name on the embed routes (ollama_models.entry_for): adapters change generation.
EMBED_BASE = "embeddings come from the base model: name '{model}'"
EMBED_TIMEOUT_S = 600.0  # one embeddings batch, load excluded (the lease waited for that)


async def _generating(request: web.Request, cls: type[ChatRequest] | type[GenerateRequest]):
    reg: Registry = request.app["registry"]
    body = await request.read()
    req = parse_model(cls, load_json(body))
    req.to_chat_job()  # every mistake it can find is a 400 here, before a model loads
    entry, request[ADAPTER] = await route_for(
        reg, req.model, (req.model_extra or {}).get("adapter")
    )
    request["model"] = entry.id  # the metrics label, also when the lease fails
    bind_log_context(model=entry.id)
    check_mounted(reg, entry.id, request[ADAPTER])
    check_route(entry, reg.settings, request.path)  # an embedder loads nothing here
    keep_alive_s = keep_alive_for(request, reg.settings, entry.id, req.keep_alive_s)
    if req.empty:  # Ollama's load / unload request
        reason = "load"
        if req.keep_alive_s == 0:
            if keep_alive_s != 0:  # an explicit unload is refused, not ignored: say so
                raise Forbidden(
                    "Unloading a model with keep_alive 0 needs the admin token (or loopback "
                    "when none is set); api_keep_alive_unloads = true lets any API key do it"
                )
            reason = "unload"
            slot = reg.lifecycle.slots.get(entry.id)
            if slot is not None:
                await unload_when_idle(reg.lifecycle, slot)
        else:
            async with reg.leases.lease(entry.id, keep_alive_s):
                pass
        answer = ChatAnswer if cls is ChatRequest else GenerateAnswer
        return json_response(answer(model=req.model, done=True, done_reason=reason))
    log.info("proxy model=%s path=%s request_id=%s", entry.id, request.path, request["request_id"])
    return await forward_leased(request, reg, entry.id, body, keep_alive_s)


async def chat(request: web.Request) -> web.StreamResponse:
    return await _generating(request, ChatRequest)


async def generate(request: web.Request) -> web.StreamResponse:
    return await _generating(request, GenerateRequest)


async def _embed(request: web.Request) -> tuple[EmbedRequest, list[list[float]], int]:
    """Embeddings through the worker's /v1/embeddings: (request, vectors, prompt tokens)."""
    reg: Registry = request.app["registry"]
    req = parse_model(EmbedRequest, load_json(await request.read()))
    entry = await entry_for(reg, req.model, EMBED_BASE)
    if (req.model_extra or {}).get("adapter") is not None:
        why = f"LoRA adapters apply to generation; {EMBED_BASE.format(model=entry.id)}"
        raise BadRequest(why, param="adapter")
    request["model"] = entry.id
    bind_log_context(model=entry.id)
    check_route(entry, reg.settings, request.path)  # a chat model loads nothing here
    body: dict = {"model": entry.id, "input": req.texts(), "truncate": req.truncate}
    if req.dimensions is not None:
        body["dimensions"] = req.dimensions
    async with reg.leases.lease(
        entry.id, keep_alive_for(request, reg.settings, entry.id, req.keep_alive_s)
    ) as slot:
        if not body["input"]:  # Ollama's way to load an embedding model
            return req, [], 0
        try:
            status, reply = await reg.upstream.post_json(
                slot.socket, BY_PATH[request.path].worker_path, EMBED_TIMEOUT_S, body
            )
        except UPSTREAM_ERRORS:
            raise BadGateway(f"The worker for '{entry.id}' stopped before it answered") from None
    if status == 404:  # the worker has no embeddings route: a chat model
        raise BadRequest(f"'{req.model}' does not support embeddings", param="model")
    if status >= 400:
        err = reply.get("error") if isinstance(reply, dict) else None
        failure = MlxdError(str(err.get("message")) if isinstance(err, dict) else "failed")
        failure.status = status
        raise failure
    try:
        out = WorkerEmbeddings.model_validate(reply)
    except ValidationError:
        raise BadGateway(f"The worker for '{entry.id}' sent no embeddings") from None
    vectors = [d.embedding for d in sorted(out.data, key=lambda d: d.index)]
    return req, vectors, out.usage.prompt_tokens


async def embed(request: web.Request) -> web.Response:
    t0 = time.monotonic_ns()
    req, vectors, tokens = await _embed(request)
    return json_response(
        EmbedAnswer(
            model=req.model,
            embeddings=vectors,
            total_duration=time.monotonic_ns() - t0,
            prompt_eval_count=tokens,
        )
    )


async def embeddings(request: web.Request) -> web.Response:
    """The older single-text route: {"embedding": [...]}."""
    _, vectors, _ = await _embed(request)
    return json_response({"embedding": vectors[0] if vectors else []})


def add_ollama_routes(app: web.Application) -> None:
    app.router.add_get("/api/version", version)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", ps)
    app.router.add_post("/api/show", show)
    app.router.add_post("/api/chat", chat)  # forwarded to the worker's /api/chat
    app.router.add_post("/api/generate", generate)  # and /api/generate
    app.router.add_post("/api/embed", embed)
    app.router.add_post("/api/embeddings", embeddings)
    add_manage_routes(app)  # /api/pull, /api/delete, /api/copy, /api/create, /api/push
