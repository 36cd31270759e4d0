"""Ollama's model management on the supervisor's port: /api/pull, /api/delete, /api/copy and
/api/create (supervisor/store/ does the work; docs/api.md, "Managing models"). /api/push is 501.

They change what is on disk, so they follow the admin API's access rule (the admin token when
one is set, else loopback clients; never another origin: shared/routes.py MANAGE_PATHS).
Mistakes are 400s before anything starts; pull and create then stream Ollama's NDJSON
progress (`stream: false`: one line, the last). Copy, create and delete go on if the client
leaves; a pull stops when the last client following it leaves.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
from aiohttp import web

from mlxd.shared.adapters import split_adapter
from mlxd.shared.background import outlive_client
from mlxd.shared.errors import BadRequest, MlxdError, NotFound, Unavailable, ollama_body
from mlxd.shared.folder_settings import FolderSettings
from mlxd.shared.wire.bodies import load_json, parse_model
from mlxd.shared.wire.ollama import model_id_of
from mlxd.shared.wire.ollama_manage import (
    CopyRequest,
    CreateRequest,
    DeleteRequest,
    ProgressLine,
    PullRequest,
)
from mlxd.supervisor.http.ollama_models import entry_for
from mlxd.supervisor.registry.adapters import adapters_of
from mlxd.supervisor.registry.operations import ops_of
from mlxd.supervisor.registry.registry import Registry
from mlxd.supervisor.store.modelfile import CreateSpec, folder_settings, parse_modelfile
from mlxd.supervisor.store.names import new_model_id, pull_target
from mlxd.supervisor.store.pulls import END
from mlxd.supervisor.store.store import ModelStore, Source

log = logging.getLogger("mlxd.models")

STORE = "model_store"
NDJSON = "application/x-ndjson"
# What a LoRA adapter's name gets from what acts on a whole model (ollama_models.entry_for).
UNMOUNT = (
    "unmount it with `mlxctl unmount {model} {adapter}` "
    "(DELETE /admin/models/{model}/adapters/{adapter})"
)
WHOLE_MODELS = "copies and new models are made of whole models; mount the adapter on the new one"


class NotImplementedHere(MlxdError):
    status = 501
    type = "invalid_request_error"


class _Holder:
    """The app's one ModelStore, made at its first request: routes are added before (and,
    in tests of other routes, without) the registry it works through."""

    store: ModelStore | None = None


def store_of(app: web.Application) -> ModelStore:
    holder = app[STORE]
    if holder.store is None:
        holder.store = ModelStore(app["registry"], ops_of(app))
    return holder.store


def _parts(request: web.Request) -> tuple[Registry, ModelStore]:
    return request.app["registry"], store_of(request.app)


async def _from_queue(q: asyncio.Queue) -> AsyncIterator[ProgressLine]:
    while (item := await q.get()) is not END:
        if isinstance(item, MlxdError):
            raise item
        if isinstance(item, BaseException):
            log.error("model operation failed", exc_info=item)
            raise MlxdError("Internal server error (the daemon's log has the details)")
        yield item


async def _answer(
    request: web.Request, stream: bool, lines: AsyncIterator[ProgressLine]
) -> web.StreamResponse:
    """The lines as NDJSON (a failure: Ollama's `{"error"}` line), or the last one alone."""
    if not stream:
        last = ProgressLine(status="success")
        async for line in lines:
            last = line
        return web.Response(body=orjson.dumps(last.to_dict()), content_type="application/json")
    resp = web.StreamResponse(headers={"Content-Type": NDJSON})
    await resp.prepare(request)
    try:
        async for line in lines:
            await resp.write(orjson.dumps(line.to_dict()) + b"\n")
    except MlxdError as err:
        await resp.write(orjson.dumps(ollama_body(err)) + b"\n")
    await resp.write_eof()
    return resp


async def pull(request: web.Request) -> web.StreamResponse:
    reg, store = _parts(request)
    req = parse_model(PullRequest, load_json(await request.read()))
    target = pull_target(req.model_name, req.revision)
    the_pull, q = await store.pull(target)
    try:
        return await _answer(request, req.stream, _from_queue(q))
    finally:
        the_pull.leave(q)  # the last client to leave cancels the pull
        # The metrics label names a model once it is one (bounded: any name may be asked).
        if target.model_id in reg.catalog.entries():
            request["model"] = target.model_id


def _background(request: web.Request, coro, q: asyncio.Queue | None = None) -> asyncio.Task:
    """Run `coro` on (a client that leaves does not stop it); its end goes into `q`."""
    task = request.app["registry"].tasks.spawn(coro, inherit_context=True)
    if q is not None:
        task.add_done_callback(lambda t: q.put_nowait(_outcome(t)))
    return task


def _outcome(task: asyncio.Task) -> object:
    """What a streamed build's queue gets at its end: END, or the error that ended it (a
    shutdown's cancel too: the build did not finish, and must not read as a success)."""
    if task.cancelled():
        return Unavailable("The model was not finished: mlxd is shutting down")
    return END if task.exception() is None else task.exception()


async def delete(request: web.Request) -> web.Response:
    reg, store = _parts(request)
    name = parse_model(DeleteRequest, load_json(await request.read())).model_name
    aliases = reg.settings.alias_map()
    if (alias := next((n for n in (name, model_id_of(name)) if n in aliases), None)) is not None:
        raise BadRequest(  # deleting a name must not delete the model it stands for
            f"'{alias}' is an alias of '{aliases[alias]}' in config.toml: delete "
            f"'{aliases[alias]}' to delete the model, or remove the alias from config.toml",
            param="model",
        )
    try:
        entry = await entry_for(reg, name, UNMOUNT)
    except NotFound:  # what a cancelled pull of that name left, if anything
        try:
            leftover = store.discard_download(pull_target(name))
        except BadRequest:
            leftover = False
        if not leftover:
            raise
        return web.Response(status=200)
    request["model"] = entry.id
    await outlive_client(_background(request, store.delete(entry)), f"The deletion of '{entry.id}'")
    return web.Response(status=200)


def _not_an_adapter(reg: Registry, model_id: str, param: str) -> None:
    """A 400 for a new model whose id is a mounted adapter's name: a model id wins over an
    adapter (Catalog.route), so it would silently take that name from the adapter."""
    section = reg.settings.models.get(model_id)
    if section is not None and section.base is not None:  # a configured adapter's own id
        raise BadRequest(
            f"'{model_id}' is a LoRA adapter on '{section.base}' in config.toml; choose "
            "another name for the new model",
            param=param,
        )
    split = split_adapter(model_id)
    if split is None:
        return
    try:
        base = reg.catalog.resolve(split[0]).id
    except NotFound:
        return
    if split[1] in adapters_of(reg, base):
        raise BadRequest(
            f"'{model_id}' names the LoRA adapter '{split[1]}' mounted on '{base}'; "
            "choose another name for the new model",
            param=param,
        )


async def copy(request: web.Request) -> web.Response:
    reg, store = _parts(request)
    req = parse_model(CopyRequest, load_json(await request.read()))
    entry = await entry_for(reg, req.source, WHOLE_MODELS, "source")
    dest = new_model_id(req.destination, "destination")
    _not_an_adapter(reg, dest, "destination")
    if dest == entry.id:
        raise BadRequest("'source' and 'destination' are the same model", param="destination")
    store.check_destination(dest)
    request["model"] = dest
    build = store.build(dest, store.source_of_model(entry), FolderSettings(), lambda line: None)
    await outlive_client(_background(request, build), f"The copy to '{dest}'")
    return web.Response(status=200)


async def _source(reg: Registry, store: ModelStore, name: str) -> Source:
    """`from`: an absolute path on this machine (a GGUF file, a model folder), else a model."""
    if name.startswith(("/", "~", "./", "../")) or name.lower().endswith(".gguf"):
        path = Path(name).expanduser()
        if not path.is_absolute():
            raise BadRequest(
                f"'from' {name[:300]} is a relative path: give an absolute path on the "
                "daemon's machine",
                param="from",
            )
        return store.source_of_path(path)
    return store.source_of_model(await entry_for(reg, name, WHOLE_MODELS, "from"))


async def create(request: web.Request) -> web.StreamResponse:
    reg, store = _parts(request)
    req = parse_model(CreateRequest, load_json(await request.read()))
    req.refuse_unsupported()
    model_id = new_model_id(req.model_name)
    _not_an_adapter(reg, model_id, "model")
    store.check_destination(model_id)
    spec = parse_modelfile(req.modelfile) if req.modelfile else CreateSpec()
    spec.source = req.from_ or spec.source
    spec.system = req.system if req.system is not None else spec.system
    spec.template = req.template if req.template is not None else spec.template
    spec.parameters.update({k.lower(): v for k, v in (req.parameters or {}).items()})
    settings = folder_settings(spec)
    if not spec.source:
        raise BadRequest(
            "'from' is required (FROM in a modelfile): a model, or an absolute path to a GGUF "
            "file or a model folder on this machine",
            param="from",
        )
    source = await _source(reg, store, spec.source)
    request["model"] = model_id
    q: asyncio.Queue = asyncio.Queue()
    _background(request, store.build(model_id, source, settings, q.put_nowait), q)
    return await _answer(request, req.stream, _from_queue(q))


async def push(request: web.Request) -> web.Response:
    raise NotImplementedHere(
        "/api/push is not available: mlxd does not publish models to a registry"
    )


async def _close(app: web.Application) -> None:
    if app[STORE].store is not None:
        await app[STORE].store.close()


def add_manage_routes(app: web.Application) -> None:
    """Register the routes and the app's one ModelStore (closed when the app shuts down)."""
    app[STORE] = _Holder()
    app.on_shutdown.append(_close)
    app.router.add_post("/api/pull", pull)
    app.router.add_post("/api/push", push)
    app.router.add_post("/api/create", create)
    app.router.add_post("/api/copy", copy)
    app.router.add_delete("/api/delete", delete)
