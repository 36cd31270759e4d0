"""Server-sent events over an aiohttp StreamResponse."""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel

from mlxd.shared.wire.safe_json import dumps
from mlxd.worker.chat.events import QuietTicks

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
KEEPALIVE = b": keep-alive\n\n"
DONE = b"data: [DONE]\n\n"


async def open_stream(
    request: web.Request, headers: dict[str, str] | None = None, media_type: str | None = None
) -> web.StreamResponse:
    """Start a stream: SSE, or another streamed `media_type` (Ollama's NDJSON)."""
    kind = {"Content-Type": media_type} if media_type else {}
    resp = web.StreamResponse(status=200, headers={**SSE_HEADERS, **kind, **(headers or {})})
    rid = request.get("request_id")
    if rid:
        resp.headers["x-request-id"] = rid
    await resp.prepare(request)
    return resp


def data(body: BaseModel | dict, event: str | None = None) -> bytes:
    """One SSE event."""
    payload = dumps(body.model_dump() if isinstance(body, BaseModel) else body)
    head = b"event: " + event.encode() + b"\n" if event else b""
    return head + b"data: " + payload + b"\n\n"


class Heartbeat(QuietTicks):
    """When a quiet stream is due a protocol event rather than a comment or a `ping`.

    Coding-agent clients run an idle watchdog that only counts parsed events: Claude Code
    skips Anthropic `ping`s and Codex never sees SSE comments, so a long prefill looks like a
    dead stream to them. Writers call `touch()` whenever they send output and `due()` at each
    keep-alive tick; `due()` is true once `interval_s` passed without output. Ticks come every
    few seconds (chat/run.py's KEEPALIVE_S), so the interval is rounded up to the next tick.
    """

    # Timer wake-ups run a little early or late: without the slack, a tick that lands a hair
    # before the interval would double the gap between events.
    SLACK_S = 0.5
