"""The Ollama API on the supervisor's port (docs/api.md, "Ollama API").

Model listings (/api/version, /api/tags, /api/ps, /api/show) are answered here from the
catalog and the lifecycle. /api/chat and /api/generate are checked here (a mistake is a 400
before any model loads) and forwarded to the worker's own /api routes; a request without
messages or prompt is Ollama's "load" (with keep_alive 0: "unload"), answered here. The
embeddings routes are translated to the worker's OpenAI-shaped /v1/embeddings.
"""

from __future__ import annotations

import logging
import time

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from mlxd.shared.errors import (
    BadGateway,
    BadRequest,
    MlxdError,
    ModelNotFound,
    NotFound,
    closest,
)
from mlxd.shared.logs import bind_log_context
from mlxd.shared.routes import BY_PATH
from mlxd.shared.sampling import resolve_defaults
from mlxd.shared.wire.bodies import load_json, parse_model
from mlxd.shared.wire.ollama import (
    ChatRequest,
    EmbedRequest,
    GenerateRequest,
    ModelRequest,
    model_id_of,
)
from mlxd.shared.wire.ollama_answers import (
    OLLAMA_VERSION,
    ChatAnswer,
    EmbedAnswer,
    GenerateAnswer,
    ModelDetails,
    Running,
    RunningModel,
    ShowAnswer,
    TagModel,
    Tags,
    WorkerEmbeddings,
    ollama_name,
    timestamp,
)
from mlxd.shared.worker_spec import MODEL_DEFAULT_FIELDS
from mlxd.supervisor.catalog.cards import check_route
from mlxd.supervisor.catalog.discovery import ModelEntry
from mlxd.supervisor.catalog.folder_info import FolderInfo, folder_info
from mlxd.supervisor.http.auth import Forbidden, keep_alive_for
from mlxd.supervisor.http.proxy import UPSTREAM_ERRORS, forward_leased
from mlxd.supervisor.lifecycle.states import State
from mlxd.supervisor.registry.registry import Registry
from mlxd.supervisor.scheduling.keepalive import unload_when_idle

log = logging.getLogger("mlxd.ollama")

EMBED_TIMEOUT_S = 600.0  # one embeddings batch, load excluded (the lease waited for that)
FOREVER_S = 292 * 365.25 * 86400  # what Ollama shows as a keep_alive of -1's expiry
LOADED = (State.READY, State.DRAINING)


class NotImplementedHere(MlxdError):
    """An Ollama route for managing model files, which mlxd does with mlxctl instead."""

    status = 501
    type = "invalid_request_error"


def _json(body: BaseModel | dict) -> web.Response:
    data = body.model_dump() if isinstance(body, BaseModel) else body
    return web.Response(body=orjson.dumps(data), content_type="application/json")


async def _entry(reg: Registry, name: str) -> ModelEntry:
    """The catalog entry an Ollama name means ("a:latest" is "a"); 404 in Ollama's words."""
    for candidate in dict.fromkeys((name, model_id_of(name))):
        await reg.catalog.settle(candidate)
        try:
            return reg.catalog.resolve(candidate)
        except ModelNotFound:
            continue
    # Suggested as Ollama names ("x:latest"), matched on the id the name means.
    near = closest(model_id_of(name), reg.catalog.known_names())
    hint = f" (did you mean '{ollama_name(near)}'?)" if near is not None else ""
    raise NotFound(f"model '{name[:200]}' not found{hint}", param="model", code="model_not_found")


def _details(info: FolderInfo) -> ModelDetails:
    return ModelDetails(
        family=info.family,
        families=[info.family] if info.family else None,
        parameter_size=info.parameter_size,
        quantization_level=info.quantization,
    )


def _tag(entry: ModelEntry, info: FolderInfo) -> TagModel:
    name = ollama_name(entry.id)
    return TagModel(
        name=name,
        model=name,
        modified_at=timestamp(info.modified),
        size=entry.weights_bytes,
        digest=info.digest,
        details=_details(info),
    )


async def version(request: web.Request) -> web.Response:
    return _json({"version": OLLAMA_VERSION})


async def tags(request: web.Request) -> web.Response:
    reg: Registry = request.app["registry"]
    entries = reg.catalog.entries()
    models = [_tag(e, folder_info(e.path)) for _, e in sorted(entries.items())]
    return _json(Tags(models=models))


async def ps(request: web.Request) -> web.Response:
    """Loaded models and when their keep-alive unloads them."""
    reg: Registry = request.app["registry"]
    now, wall = reg.lifecycle.clock(), time.time()
    models = []
    for _, slot in sorted(reg.lifecycle.slots.items()):
        if slot.state not in LOADED:
            continue
        info = folder_info(slot.entry.path)
        keep = slot.keep_alive_s
        if keep < 0 or slot.settings.pinned:
            left = FOREVER_S
        else:  # a busy model's keep-alive starts when its last request ends
            left = keep if slot.leases else keep - (now - slot.last_used)
        tag = _tag(slot.entry, info)
        held = slot.memory.total_bytes  # the one figure mlxctl ps and /admin/memory show
        models.append(
            RunningModel(
                **tag.model_dump(exclude={"size", "details"}),
                details=tag.details,
                size=held,
                size_vram=held,  # unified memory: all of it is the GPU's
                expires_at=timestamp(wall + min(FOREVER_S, max(0.0, left))),
                context_length=slot.settings.context_limit or info.context_length,
            )
        )
    return _json(Running(models=models))


async def show(request: web.Request) -> web.Response:
    reg: Registry = request.app["registry"]
    req = parse_model(ModelRequest, load_json(await request.read()))
    entry = await _entry(reg, req.model_name)
    info = folder_info(entry.path)
    ms = reg.settings.for_model(entry.id)
    context = ms.context_limit or info.context_length
    # What a silent request gets (shared/sampling.py), as the worker resolves it
    section = {name: getattr(ms, name) for name in MODEL_DEFAULT_FIELDS}
    shown = {**info.defaults, **resolve_defaults(entry.path, section).sampling}
    params = "\n".join(f"{k:<30} {v}" for k, v in shown.items())
    fam, cfg = info.family or "model", info.config
    model_info = {
        "general.architecture": info.family,
        "general.basename": entry.id,
        "general.parameter_count": info.parameters,
        f"{fam}.context_length": context,
        f"{fam}.embedding_length": cfg.get("hidden_size"),
        f"{fam}.block_count": cfg.get("num_hidden_layers"),
        f"{fam}.attention.head_count": cfg.get("num_attention_heads"),
        f"{fam}.attention.head_count_kv": cfg.get("num_key_value_heads"),
        f"{fam}.vocab_size": cfg.get("vocab_size"),
    }
    answer = ShowAnswer(
        modelfile=f"# mlxd model '{entry.id}' ({entry.source})\nFROM {entry.id}\n"
        + "".join(f"PARAMETER {k} {v}\n" for k, v in shown.items()),
        parameters=params,
        template=info.template,
        details=_details(info),
        model_info={k: v for k, v in model_info.items() if v is not None},
        capabilities=info.capabilities,
        modified_at=timestamp(info.modified),
    )
    return _json(answer)


async def _generating(request: web.Request, cls: type[ChatRequest] | type[GenerateRequest]):
    reg: Registry = request.app["registry"]
    body = await request.read()
    req = parse_model(cls, load_json(body))
    req.to_chat_job()  # every mistake it can find is a 400 here, before a model loads
    entry = await _entry(reg, req.model)
    request["model"] = entry.id  # the metrics label, also when the lease fails
    bind_log_context(model=entry.id)
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
        return _json(answer(model=req.model, done=True, done_reason=reason))
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
    entry = await _entry(reg, req.model)
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
    return _json(
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
    return _json({"embedding": vectors[0] if vectors else []})


async def manage_models(request: web.Request) -> web.Response:
    raise NotImplementedHere(
        f"{request.path} is not available: mlxd manages model folders with mlxctl "
        "(mlxctl pull ORG/NAME, mlxctl rm MODEL, mlxctl import-gguf FILE)"
    )


def add_ollama_routes(app: web.Application) -> None:
    app.router.add_get("/api/version", version)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", ps)
    app.router.add_post("/api/show", show)
    app.router.add_post("/api/chat", chat)  # forwarded to the worker's /api/chat
    app.router.add_post("/api/generate", generate)  # and /api/generate
    app.router.add_post("/api/embed", embed)
    app.router.add_post("/api/embeddings", embeddings)
    for path in ("/api/pull", "/api/push", "/api/create", "/api/copy"):
        app.router.add_post(path, manage_models)
    app.router.add_delete("/api/delete", manage_models)
