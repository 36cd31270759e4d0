"""/admin/models/{id}/adapters: mount, unmount and list a model's LoRA adapters without
restarting its worker.

A mount loads the model if it is not running (as a request would), asks its worker to check
and load the adapter (a bad one is the worker's 4xx, passed on; the worker serves on), and
records it with the model's slot, so a restart of that worker mounts it again. Requests then
name it "<model>:<name>" (shared/adapters.py)."""

from __future__ import annotations

from pathlib import Path

import orjson
from aiohttp import web
from pydantic import BaseModel, Field

from mlxd.shared.adapters import adapter_model_id, check_name
from mlxd.shared.errors import BadRequest, MlxdError, NotFound
from mlxd.shared.model_facts import adapter_refusal
from mlxd.shared.wire.bodies import load_json, parse_model
from mlxd.supervisor.catalog.cards import facts_of
from mlxd.supervisor.lifecycle.states import State
from mlxd.supervisor.registry.adapters import adapter_ids, adapters_of
from mlxd.supervisor.registry.registry import Registry

MOUNT_TIMEOUT_S = 120.0  # reading and hashing a large adapter on the worker


class MountRequest(BaseModel):
    name: str = Field(min_length=1, max_length=64)
    path: str = Field(min_length=1, max_length=4096)


class WorkerRefused(MlxdError):
    """The worker's own 4xx for a mount, passed on with its status and message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.type = "invalid_request_error" if status < 500 else "server_error"


def _json(data, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


def _passed_on(status: int, reply: dict) -> None:
    if status != 200:
        err = reply.get("error") if isinstance(reply, dict) else None
        message = err.get("message") if isinstance(err, dict) else None
        raise WorkerRefused(status, message or f"The worker answered {status}")


async def mount(request: web.Request) -> web.Response:
    reg: Registry = request.app["registry"]
    entry = reg.catalog.resolve(request.match_info["model_id"])
    model_id = entry.id
    body = parse_model(MountRequest, load_json(await request.read()))
    check_name(body.name, param="name")
    if why := adapter_refusal(facts_of(entry, reg.settings), model_id):
        raise BadRequest(why, param="model_id")  # before a load: nothing to load it for
    path = Path(body.path).expanduser()
    async with reg.leases.lease(model_id) as slot:  # loads the model if it is not running
        status, reply = await reg.upstream.post_json(
            slot.socket, "/adapters", MOUNT_TIMEOUT_S, {"name": body.name, "path": str(path)}
        )
        _passed_on(status, reply)
        slot.settings.adapters[body.name] = path
    return _json({**reply, "id": adapter_model_id(model_id, body.name), "model": model_id})


async def unmount(request: web.Request) -> web.Response:
    reg: Registry = request.app["registry"]
    model_id = reg.catalog.resolve(request.match_info["model_id"]).id
    name = request.match_info["name"]
    slot = reg.lifecycle.slots.get(model_id)
    if slot is None or name not in slot.settings.adapters:
        raise NotFound(f"No adapter named {name!r} is mounted on {model_id!r}", param="name")
    if slot.state is State.READY:
        status, reply = await reg.upstream.post_json(
            slot.socket, "/adapters/unmount", MOUNT_TIMEOUT_S, {"name": name}
        )
        if status != 404:  # a worker restarted since, without it: nothing to unmount there
            _passed_on(status, reply)
    del slot.settings.adapters[name]
    return _json({"name": name, "model": model_id, "unmounted": True})


async def list_adapters(request: web.Request) -> web.Response:
    reg: Registry = request.app["registry"]
    model_id = reg.catalog.resolve(request.match_info["model_id"]).id
    slot = reg.lifecycle.slots.get(model_id)
    loaded: dict[str, dict] = {}
    if slot is not None and slot.state is State.READY:
        status, reply = await reg.upstream.get_json(slot.socket, "/adapters", 5.0)
        if status == 200:
            loaded = {a["name"]: a for a in reply.get("data", [])}
    paths = adapters_of(reg, model_id)
    rows = [
        {"id": mid, "name": name, "path": str(paths[name]), **loaded.get(name, {})}
        for mid, name in adapter_ids(reg, model_id).items()
    ]
    return _json({"object": "list", "model": model_id, "data": rows})


def add_adapter_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/admin/models/{model_id:.+}/adapters", list_adapters)
    r.add_post("/admin/models/{model_id:.+}/adapters", mount)
    r.add_delete("/admin/models/{model_id:.+}/adapters/{name}", unmount)
