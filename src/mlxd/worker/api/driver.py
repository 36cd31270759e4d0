"""The one chat driver: every generating route, from request body to the stream's last byte.

A surface is a wire request model (`to_chat_job()`, `stream`), an id prefix and a `Writer`
that prints a run in the surface's dialect. The driver does the rest once for all of them:
admission, parsing, the prompt-cache session, preparing the run, the access log's progress,
and then either the whole body or the stream: keep-alives and heartbeats, the first-token
marker in front of the first generated text (the supervisor times the first token by it), and
the end of a stream that fails: whatever raised, at whatever point, the client gets the
surface's error event and its terminator (a writer's own error event, else the route's generic
one), never a stream that stops without an end.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from mlxd.shared.adapters import ADAPTER_HEADER
from mlxd.shared.errors import MlxdError, sse_error_bytes
from mlxd.shared.wire import ollama
from mlxd.shared.wire.anthropic import MessagesRequest
from mlxd.shared.wire.bodies import load_json, parse_model
from mlxd.shared.wire.completions import CompletionRequest
from mlxd.shared.wire.first_token import FIRST_TOKEN
from mlxd.shared.wire.openai import ChatCompletionRequest
from mlxd.shared.wire.responses import ResponsesRequest
from mlxd.shared.wire.safe_json import dumps
from mlxd.worker.api import sse
from mlxd.worker.cache.keys import session_of
from mlxd.worker.chat.events import (
    CallPart,
    Collected,
    Delta,
    Done,
    Keepalive,
    TokenUsage,
    ToolCalls,
    ToolCallStart,
)
from mlxd.worker.chat.run import ChatRun
from mlxd.worker.chat.state import WorkerState
from mlxd.worker.chat.tool_calls import ToolCall

log = logging.getLogger("mlxd.worker.driver")


class Writer:
    """How one API surface prints a run: a subclass per surface.

    Stream methods return the bytes to send (b"" for nothing); the driver writes each event's
    bytes at once. `body` builds the non-streamed answer. `media_type`: the stream's
    Content-Type, when it is not SSE.
    """

    media_type: str | None = None

    def __init__(self, req: Any, run: ChatRun, rid: str):
        self.req = req
        self.run = run
        self.rid = rid

    def open(self) -> bytes:
        """What a stream starts with, before any output."""
        return b""

    def delta(self, d: Delta) -> bytes:
        raise NotImplementedError

    # Whether this surface streams a call's arguments as they are written (tool_part gets
    # them); a surface that does not gets each call whole (tool_calls).
    streams_tool_args = False

    def tool_calls(self, calls: list[ToolCall]) -> bytes:
        return b""  # a surface without tools never gets calls

    def tool_part(self, part: CallPart) -> bytes:
        """A call's start, its next arguments fragment, or its cut (streams_tool_args)."""
        return b""

    def keepalive(self, heartbeat_due: bool) -> bytes:
        """A quiet tick; `heartbeat_due` when an agent's idle watchdog needs a real event."""
        return sse.KEEPALIVE

    def done(self, done: Done, usage: TokenUsage) -> bytes:
        raise NotImplementedError

    def error(self, err: MlxdError, usage: TokenUsage) -> bytes:
        """The stream failed: the surface's error event, in the shared envelope, and whatever
        ends the stream after it."""
        raise NotImplementedError

    def body(self, out: Collected, usage: TokenUsage) -> BaseModel:
        raise NotImplementedError


# The surfaces' request models: each has `stream` and `to_chat_job()` (a new surface's goes here).
ChatBody = (
    ChatCompletionRequest
    | CompletionRequest
    | MessagesRequest
    | ResponsesRequest
    | ollama.ChatRequest
    | ollama.GenerateRequest
)


@dataclass(frozen=True)
class Surface:
    """One API surface: its request model, response id prefix and writer."""

    request: type[ChatBody]
    id_prefix: str
    writer: type[Writer]


async def serve(request: web.Request, surface: Surface) -> web.StreamResponse:
    """Answer one generating request on `surface`."""
    state: WorkerState = request.app["state"]
    state.ready()  # a 503 while loading or draining, before the body is even read
    state.generating += 1
    try:
        return await _answer(request, surface, state)
    finally:
        state.generating -= 1


async def _answer(request: web.Request, surface: Surface, state: WorkerState) -> web.StreamResponse:
    req = parse_model(surface.request, load_json(await request.read()))
    job = req.to_chat_job()
    job.session = job.session or session_of(request, req)
    job.adapter = request.headers.get(ADAPTER_HEADER) or None
    rid = surface.id_prefix + uuid.uuid4().hex[:24]
    run = await ChatRun.prepare(state, job, rid)
    request["progress"] = run  # the access log's line if the client leaves
    writer = surface.writer(req, run, rid)
    with run:
        if not req.stream:
            out = await run.collect()
            body = writer.body(out, run.usage(out.done))
            return web.Response(
                body=dumps(body.model_dump()),
                content_type="application/json",
                headers=run.headers,
            )
        resp = await sse.open_stream(request, run.headers, writer.media_type)
        heartbeat = sse.Heartbeat(state.config.stream_heartbeat_s, state.clock)
        async for data in stream_bytes(run, writer, heartbeat, request.path):
            await resp.write(data)
        return resp


async def stream_bytes(
    run, writer: Writer, heartbeat: sse.Heartbeat, path: str
) -> AsyncIterator[bytes]:
    """The stream's bytes, one piece per event, ended by the surface's error event if
    anything raises on the way (a client that leaves is no failure: it passes through)."""
    try:
        async for data in _events_bytes(run, writer, heartbeat):
            yield data
    except Exception as exc:  # noqa: BLE001 - a stream must end, whatever broke it
        yield failure_bytes(run, writer, exc, path)


def failure_bytes(run, writer: Writer, exc: Exception, path: str) -> bytes:
    """What ends a stream that `exc` broke: the writer's error event (it closes what it
    opened), or the route's generic error event if the writer cannot write even that."""
    if isinstance(exc, MlxdError):
        err = exc
        log.info("stream failed request_id=%s: %s", writer.rid, err.message)
    else:
        err = MlxdError("Internal server error while writing the stream")
        log.exception("stream failed request_id=%s", writer.rid)
    try:
        return writer.error(err, run.usage(Done("error", run.completion_tokens, error=err)))
    except Exception:  # noqa: BLE001 - the writer's own state may be what broke
        log.exception("the stream's error event failed too request_id=%s", writer.rid)
        return sse_error_bytes(err, path)


async def _events_bytes(run, writer: Writer, heartbeat: sse.Heartbeat) -> AsyncIterator[bytes]:
    """The run's events in the surface's words; the marker goes in front of the first piece
    that follows generated text (a non-empty delta or a tool call)."""
    pending = sent = False  # the marker: owed since the first token, sent once
    if opening := writer.open():
        yield opening
    async for ev in run.events(tool_parts=writer.streams_tool_args):
        if isinstance(ev, Keepalive):
            data = writer.keepalive(heartbeat.due())
        elif isinstance(ev, Done):
            usage = run.usage(ev)
            data = writer.error(ev.error, usage) if ev.error is not None else writer.done(ev, usage)
        else:
            pending = pending or (not sent and _generated(ev))
            if isinstance(ev, Delta):
                data = writer.delta(ev)
            elif isinstance(ev, ToolCalls):
                data = writer.tool_calls(ev.calls)
            else:
                data = writer.tool_part(ev)
            if data:  # output a client parses: the heartbeat's interval starts again
                heartbeat.touch()
        if pending and data:
            data, pending, sent = FIRST_TOKEN + data, False, True
        if data:
            yield data


def _generated(ev: Delta | ToolCalls | CallPart) -> bool:
    """Whether `ev` is generated output (the first-token marker goes in front of the first)."""
    if isinstance(ev, Delta):
        return bool(ev.text)
    return isinstance(ev, ToolCalls | ToolCallStart)
