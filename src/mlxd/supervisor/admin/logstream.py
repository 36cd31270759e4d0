"""GET /admin/logs/stream?model=ID: a worker's log as server-sent events, for the dashboard.

The stream sends the last `tail` lines, then every complete line appended, checking the file
every POLL_S. It follows the model's current worker: after a hot reload (a new socket, so a new
log file) it says so in a `file` event and reads the new file from its start. Bounded: at most
MAX_STREAMS at once (429 beyond), MAX_STREAM_S each (the page reconnects), and the reads of
logtail.py; a comment every HEARTBEAT_S keeps proxies from closing an idle stream.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
from aiohttp import web

from mlxd.shared.errors import BadRequest, TooManyRequests
from mlxd.supervisor.admin import logtail
from mlxd.supervisor.lifecycle.launch import log_path, socket_path
from mlxd.supervisor.registry.registry import Registry

MAX_STREAMS = 8
MAX_STREAM_S = 3600.0
POLL_S = 0.5
HEARTBEAT_S = 15.0
DEFAULT_TAIL = 50
MAX_TAIL = 1000


class Streams:
    """The app's open log streams: how many, and the event that ends them all at shutdown."""

    def __init__(self) -> None:
        self.open = 0
        self.stopping = asyncio.Event()


STREAMS = web.AppKey("log_streams", Streams)


def current_log(reg: Registry, model_id: str) -> Path:
    """The log file of `model_id`'s current worker (or the one it would get)."""
    slot = reg.lifecycle.slots.get(model_id)
    socket = slot.socket if slot is not None else socket_path(reg.settings.run_dir, model_id)
    return log_path(reg.settings.logs_dir, socket)


def _event(name: str, data: dict) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _tail_param(request: web.Request) -> int:
    raw = request.query.get("tail", str(DEFAULT_TAIL))
    if not raw.isdigit() or int(raw) > MAX_TAIL:
        raise BadRequest(f"Invalid 'tail': an integer from 0 to {MAX_TAIL}", param="tail")
    return int(raw)


async def stream_logs(request: web.Request) -> web.StreamResponse:
    reg: Registry = request.app["registry"]
    raw = request.query.get("model", "")
    if not raw:
        raise BadRequest("Missing 'model': name the model whose log to follow", param="model")
    model_id = raw if raw in reg.lifecycle.slots else reg.catalog.resolve(raw).id
    request["model"] = model_id
    n = _tail_param(request)
    streams = request.app[STREAMS]
    if streams.open >= MAX_STREAMS:
        raise TooManyRequests(f"At most {MAX_STREAMS} log streams at once; close one first")
    streams.open += 1
    try:
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await resp.prepare(request)
        await _follow(request, resp, reg, model_id, n)
        return resp
    finally:
        streams.open -= 1


async def _follow(
    request: web.Request, resp: web.StreamResponse, reg: Registry, model_id: str, n: int
) -> None:
    stop = request.app[STREAMS].stopping
    path = current_log(reg, model_id)
    lines, offset = await asyncio.to_thread(logtail.tail, path, n)
    await resp.write(_event("file", {"model": model_id, "file": path.name}))
    if lines:
        await resp.write(_event("lines", {"lines": lines}))
    started = last_sent = time.monotonic()
    while not stop.is_set() and time.monotonic() - started < MAX_STREAM_S:
        try:
            await asyncio.wait_for(stop.wait(), POLL_S)
            break
        except asyncio.TimeoutError:
            pass
        now_path = current_log(reg, model_id)
        if now_path != path:  # a hot reload: the new worker writes a new file
            path, offset = now_path, 0
            await resp.write(_event("file", {"model": model_id, "file": path.name}))
        lines, offset = await asyncio.to_thread(logtail.read_after, path, offset)
        if lines:
            await resp.write(_event("lines", {"lines": lines}))
            last_sent = time.monotonic()
        elif time.monotonic() - last_sent >= HEARTBEAT_S:
            await resp.write(b": keep-alive\n\n")
            last_sent = time.monotonic()


async def _on_shutdown(app: web.Application) -> None:
    app[STREAMS].stopping.set()  # open streams end: shutdown need not wait out its grace


def add_log_stream(app: web.Application) -> None:
    """GET /admin/logs/stream, its counter, and its end at shutdown."""
    app[STREAMS] = Streams()
    app.router.add_get("/admin/logs/stream", stream_logs)
    app.on_shutdown.append(_on_shutdown)
