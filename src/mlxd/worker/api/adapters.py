"""The worker's LoRA adapter routes, for its supervisor: list, mount, unmount.

A mount runs on the engine thread between steps (it checks the adapter against the base and
loads it); a bad adapter is that request's 4xx and the worker serves on. Adapters in the spec
are mounted at start, before READY; one that fails is logged and left out."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
from aiohttp import web
from pydantic import BaseModel, Field

from mlxd.shared.errors import BadRequest, MlxdError
from mlxd.shared.model_facts import adapter_refusal
from mlxd.shared.wire.bodies import load_json, parse_model
from mlxd.worker.chat.state import WorkerState
from mlxd.worker.engine.loop import Engine

log = logging.getLogger("mlxd.worker")


class MountBody(BaseModel):
    """POST /adapters: mount the mlx-lm adapter folder `path` as `name`."""

    name: str = Field(min_length=1, max_length=64)
    path: Path


def _json(data, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


def _adapters(engine: Engine):
    if engine.adapters is None:
        raise BadRequest("This model's worker serves no LoRA adapters (a worker group)")
    return engine.adapters


async def mount(engine: Engine, name: str, path: Path) -> dict:
    """Mount on the engine thread; the adapter's description, or the mount's error."""
    adapters = _adapters(engine)
    await engine.call(lambda: adapters.mount(name, path.expanduser()), "adapter job")
    return next(a for a in adapters.info() if a["name"] == name)


async def list_adapters(request: web.Request) -> web.Response:
    state: WorkerState = request.app["state"]
    _, engine = state.ready()
    return _json({"data": _adapters(engine).info()})


async def mount_route(request: web.Request) -> web.Response:
    state: WorkerState = request.app["state"]
    _, engine = state.ready()
    if state.facts is not None and (why := adapter_refusal(state.facts, state.config.model_id)):
        raise BadRequest(why, param="model")
    body = parse_model(MountBody, load_json(await request.read()))
    return _json(await mount(engine, body.name, body.path))


class UnmountBody(BaseModel):
    """POST /adapters/unmount: forget adapter `name` (its running rows finish on it)."""

    name: str = Field(min_length=1, max_length=64)


async def unmount_route(request: web.Request) -> web.Response:
    state: WorkerState = request.app["state"]
    _, engine = state.ready()
    body = parse_model(UnmountBody, load_json(await request.read()))
    adapters, name = _adapters(engine), body.name
    await engine.call(lambda: adapters.unmount(name), "adapter job")
    return _json({"name": name, "unmounted": True})


async def mount_configured(state: WorkerState) -> None:
    """The spec's adapters, mounted before READY; a bad one is logged and skipped."""
    engine = state.engine
    if engine is None or not state.config.adapters:
        return
    if state.facts is not None and (why := adapter_refusal(state.facts, state.config.model_id)):
        log.error("adapters %s not mounted: %s", ", ".join(state.config.adapters), why)
        return
    for name, path in state.config.adapters.items():
        try:
            await mount(engine, name, path)
        except MlxdError as exc:
            log.error("adapter %s not mounted: %s", name, exc.message)


def add_adapter_routes(app: web.Application) -> None:
    app.router.add_get("/adapters", list_adapters)
    app.router.add_post("/adapters", mount_route)
    app.router.add_post("/adapters/unmount", unmount_route)
