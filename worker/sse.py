"""Server-sent events over an aiohttp StreamResponse."""

from __future__ import annotations

import orjson
from aiohttp import web
from pydantic import BaseModel

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
KEEPALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"


async def open_stream(request: web.Request,
                      headers: dict[str, str] | None = None) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={**SSE_HEADERS, **(headers or {})})
    rid = request.get("request_id")
    if rid:
        resp.headers["x-request-id"] = rid
    await resp.prepare(request)
    return resp


def data(body: BaseModel | dict, event: str | None = None) -> bytes:
    """One SSE event."""
    payload = orjson.dumps(body.model_dump() if isinstance(body, BaseModel) else body)
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + payload + b"\n\n"
