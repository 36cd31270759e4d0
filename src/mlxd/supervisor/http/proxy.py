"""Pass a request through to a worker's socket and its response back, chunk by chunk."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from yarl import URL

from mlxd.shared.adapters import ADAPTER_HEADER
from mlxd.shared.errors import BadGateway, sse_error_bytes
from mlxd.shared.logs import bind_log_context
from mlxd.shared.middleware import REQUEST_ID
from mlxd.shared.wire.first_token import FirstTokenCutter
from mlxd.supervisor.lifecycle.process import WorkerProcess
from mlxd.supervisor.lifecycle.slot import ModelSlot
from mlxd.supervisor.lifecycle.states import State
from mlxd.supervisor.lifecycle.upstream import UpstreamPool

if TYPE_CHECKING:
    from mlxd.supervisor.registry.registry import Registry

log = logging.getLogger("mlxd.proxy")

# RFC 9110 hop-by-hop headers, plus those the proxy recomputes itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
# Credentials for mlxd itself never travel to a worker; the body was decoded here already and
# is sent as JSON (or the worker's audio body), so its original encoding and type do not
# travel either. The adapter header is the supervisor's to set (shared/adapters.py), never a
# client's.
PRIVATE = frozenset(
    {"authorization", "x-api-key", "content-encoding", "content-type", ADAPTER_HEADER}
)
# request[ADAPTER]: the LoRA adapter the request named (Catalog.route), passed to the worker.
ADAPTER = "adapter"

UPSTREAM_ERRORS = (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError)
# Worker answers passed on chunk by chunk (SSE, and the Ollama API's NDJSON); the first-token
# marker is cut out of both.
STREAMED = frozenset({"text/event-stream", "application/x-ndjson"})
# request[ON_STREAM_CHUNK]: called with each chunk of a stream once it is written, until it
# returns True (the Responses store watches for the final event with it).
ON_STREAM_CHUNK = "on_stream_chunk"
# request[ON_FIRST_TOKEN]: called once the chunk that carried the worker's first-token marker
# is written (the marker itself is cut out; the metrics middleware times the first token).
ON_FIRST_TOKEN = "on_first_token"


async def _pump(request: web.Request, resp: web.StreamResponse, up, slot: ModelSlot) -> bool:
    """Copy the worker's stream to the client; True when the worker finished it.

    Client write errors (ConnectionError) propagate; a broken upstream ends the client's stream
    with an SSE error event instead.
    """
    on_chunk = request.get(ON_STREAM_CHUNK)
    on_first = request.get(ON_FIRST_TOKEN)
    marker = FirstTokenCutter()

    async def send(data: bytes) -> None:
        nonlocal on_chunk
        await resp.write(data)  # each chunk goes out as soon as the worker wrote it
        if on_chunk is None:
            return
        try:
            if on_chunk(data):
                on_chunk = None
        except Exception:  # noqa: BLE001 - a watcher's fault must not cut the client's stream
            log.exception("stream watcher failed request_id=%s", request["request_id"])
            on_chunk = None

    chunks = up.content.iter_any()
    while True:
        try:
            chunk = await chunks.__anext__()
        except StopAsyncIteration:
            break
        except UPSTREAM_ERRORS:  # what the cutter holds is part of an unfinished line: dropped
            log.warning(
                "model=%s worker stream broke request_id=%s", slot.id, request["request_id"]
            )
            err = BadGateway(f"The worker for '{slot.id}' stopped mid-stream")
            await resp.write(sse_error_bytes(err, request.path))
            await resp.write_eof()
            return False
        chunk, first = marker.cut(chunk)
        if chunk:
            await send(chunk)
        if first and on_first is not None:
            on_first()
    if tail := marker.flush():  # the start of a marker that never finished: plain bytes
        await send(tail)
    await resp.write_eof()
    return True


def _forward_headers(headers, drop=HOP_BY_HOP | PRIVATE) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in drop}


def worker_url(request: web.Request) -> URL:
    """The worker URL for `request`: its route's own path (never the client's) and its query.

    Only plain routes forward, so a client's path text can never pick a worker route.
    """
    resource = request.match_info.route.resource
    if not isinstance(resource, web.PlainResource):
        raise TypeError(f"only plain routes are forwarded, not {resource!r}")
    return URL.build(
        path=resource.canonical, query_string=request.rel_url.raw_query_string, encoded=True
    )


class _Receipt:
    """A request body sent only once the worker asked for it (HTTP's `Expect: 100-continue`):
    its `taken` tells a worker that had the request (and may have died of it) from one that
    never read it (killed and still dying while its socket took the connection)."""

    def __init__(self, body: bytes):
        self.body = body
        self.taken = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.taken = True  # aiohttp asks for the body after the worker's "100 Continue"
        if self.body:
            yield self.body


class WorkerUnreachable(BadGateway):
    """The worker never had the request (its socket refused it, or it never answered the
    request's `Expect: 100-continue`): safe to send again."""


# After a refused connection: how long to wait for the reaper to act on a worker that
# just died (its exit, then up to 2 s for the rest of its output).
DEATH_NOTICE_S = 5.0


async def forward_leased(
    request: web.Request,
    reg: Registry,
    model_id: str,
    body: bytes,
    keep_alive_s: float | None = None,
    content_type: str = "application/json",
) -> web.StreamResponse:
    """Lease `model_id` and forward `request` to its worker as `body` of `content_type`;
    `keep_alive_s` is how long the model stays loaded after it (None: the model's configured
    keep_alive_s).

    A worker that died a moment ago (or is still dying) still looks READY until its reaper
    runs; a request it never had waits for that, then leases again (which waits for the
    restart) and is sent once more. A request the worker took and ended on is never sent again: the
    worker may have died of it. A worker that refuses while alive is a 502."""
    for attempt in (1, 2):
        async with reg.leases.lease(model_id, keep_alive_s) as slot:
            proc = slot.process
            try:
                return await forward(request, slot, body, reg.upstream, content_type)
            except WorkerUnreachable:
                if attempt == 2 or not await _reaped(slot, proc):
                    raise
        log.info(
            "model=%s worker died before the request reached it; waiting for its restart "
            "request_id=%s",
            model_id,
            request["request_id"],
        )
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


async def _reaped(slot: ModelSlot, proc: WorkerProcess | None) -> bool:
    """Whether the slot has left READY on `proc` (its reaper has acted: the next lease waits
    for the restart) within DEATH_NOTICE_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEATH_NOTICE_S
    while slot.process is proc and slot.state is State.READY:
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def forward(
    request: web.Request,
    slot: ModelSlot,
    body: bytes,
    upstream: UpstreamPool,
    content_type: str = "application/json",
) -> web.StreamResponse:
    """Proxy `request` (whose body was already read) to `slot`'s worker."""
    request["model"] = slot.id  # the metrics label and every later log line carry it
    bind_log_context(model=slot.id)
    headers = _forward_headers(request.headers)
    headers[REQUEST_ID] = request["request_id"]
    if request.get(ADAPTER):
        headers[ADAPTER_HEADER] = request[ADAPTER]
    headers["Content-Type"] = content_type
    headers["Content-Length"] = str(len(body))
    session = upstream.session(slot.socket)
    if slot.process is None or slot.process.exited():
        # Killed a moment ago and not yet reaped: a pooled connection to it would take the
        # request and then break, which reads as "died of this request". It never got it.
        raise WorkerUnreachable(f"The worker for '{slot.id}' is unreachable")
    receipt = _Receipt(body)
    try:
        up = await session.request(
            request.method, worker_url(request), data=receipt, headers=headers, expect100=True
        )
    except UPSTREAM_ERRORS as exc:  # the detail (a socket path) goes to the log only
        log.warning(
            "model=%s worker unreachable request_id=%s: %s", slot.id, request["request_id"], exc
        )
        if isinstance(exc, aiohttp.ClientConnectorError) or not receipt.taken:
            # Refused, or a dying worker's socket took it and nobody read it: never got it.
            raise WorkerUnreachable(f"The worker for '{slot.id}' is unreachable") from None
        # It may have died of this very request: never send it again.
        raise BadGateway(f"The worker for '{slot.id}' stopped before it answered") from None
    complete = False
    try:
        out_headers = _forward_headers(up.headers, HOP_BY_HOP | {"content-encoding"})
        if up.content_type not in STREAMED:
            try:
                data = await up.read()
            except UPSTREAM_ERRORS:
                raise BadGateway(f"The worker for '{slot.id}' stopped mid-response") from None
            complete = True
            return web.Response(status=up.status, body=data, headers=out_headers)
        resp = web.StreamResponse(status=up.status, headers=out_headers)
        await resp.prepare(request)
        try:
            complete = await _pump(request, resp, up, slot)
        except ConnectionError:  # the client left: dropping upstream cancels the worker's row
            log.info(
                "model=%s client left mid-stream request_id=%s", slot.id, request["request_id"]
            )
        return resp
    finally:
        if not complete:
            up.close()  # drop the upstream connection: the worker cancels the row
        else:
            up.release()
