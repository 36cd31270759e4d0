"""Pass a request through to a worker's socket and its response back, chunk by chunk."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
from aiohttp import web

from mlxd.shared.errors import BadGateway, sse_error_bytes
from mlxd.shared.logs import bind_log_context
from mlxd.shared.middleware import REQUEST_ID

from .slot import ModelSlot
from .upstream import UpstreamPool

log = logging.getLogger("mlxd.proxy")

# RFC 9110 hop-by-hop headers, plus those the proxy recomputes itself.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})
# Credentials for mlxd itself never travel to a worker.
PRIVATE = frozenset({"authorization", "x-api-key"})

UPSTREAM_ERRORS = (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError)
# request[ON_STREAM_CHUNK]: called with each chunk of a stream once it is written, until it
# returns True (the metrics middleware times the first token with it).
ON_STREAM_CHUNK = "on_stream_chunk"


async def _pump(request: web.Request, resp: web.StreamResponse, up, slot: ModelSlot) -> bool:
    """Copy the worker's stream to the client; True when the worker finished it.

    Client write errors (ConnectionError) propagate; a broken upstream ends the client's stream
    with an SSE error event instead.
    """
    on_chunk = request.get(ON_STREAM_CHUNK)
    chunks = up.content.iter_any()
    while True:
        try:
            chunk = await chunks.__anext__()
        except StopAsyncIteration:
            break
        except UPSTREAM_ERRORS:
            log.warning("model=%s worker stream broke request_id=%s", slot.id,
                        request["request_id"])
            err = BadGateway(f"The worker for '{slot.id}' stopped mid-stream")
            await resp.write(sse_error_bytes(err, request.path))
            await resp.write_eof()
            return False
        await resp.write(chunk)  # each chunk goes out as soon as the worker wrote it
        if on_chunk is not None and on_chunk(chunk):
            on_chunk = None
    await resp.write_eof()
    return True


def _forward_headers(headers, drop=HOP_BY_HOP | PRIVATE) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in drop}


async def forward(request: web.Request, slot: ModelSlot, body: bytes,
                  upstream: UpstreamPool) -> web.StreamResponse:
    """Proxy `request` (whose body was already read) to `slot`'s worker."""
    request["model"] = slot.id  # the metrics label and every later log line carry it
    bind_log_context(model=slot.id)
    headers = _forward_headers(request.headers)
    headers[REQUEST_ID] = request["request_id"]
    session = upstream.session(slot.socket)
    try:
        up = await session.request(request.method, request.rel_url.path_qs, data=body,
                                   headers=headers)
    except UPSTREAM_ERRORS as exc:
        raise BadGateway(f"The worker for '{slot.id}' is unreachable: {exc}") from None
    complete = False
    try:
        out_headers = _forward_headers(up.headers, HOP_BY_HOP | {"content-encoding"})
        if up.content_type != "text/event-stream":
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
            log.info("model=%s client left mid-stream request_id=%s", slot.id,
                     request["request_id"])
        return resp
    finally:
        if not complete:
            up.close()  # drop the upstream connection: the worker cancels the row
        else:
            up.release()
