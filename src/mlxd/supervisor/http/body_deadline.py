"""The request body's deadline: `body_timeout_s`, or `header_timeout_s` while crowded.

A body that does not arrive in time is answered 408 in the route's envelope and its connection
closed. While its client holds most of its connection cap, or the server most of its own
(ConnectionLimiter.crowded), a body gets only the header timeout: slow bodies then cannot hold
the cap (which every local program shares as 127.0.0.1) for the whole body timeout. The
deadline is looked at again every CHECK_S, so a body already arriving is cut when crowding
begins, not only the next one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from mlxd.shared.errors import MlxdError, RequestTimeout
from mlxd.shared.middleware import error_response
from mlxd.supervisor.http.limits import ConnectionLimiter

log = logging.getLogger("mlxd.limits")

CHECK_S = 0.5  # how often a body still arriving looks whether its deadline moved

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def body_deadline_s(
    limiter: ConnectionLimiter | None, client: str, body_timeout_s: float, crowded_s: float
) -> float:
    """How long a body from `client` may take now."""
    if limiter is not None and limiter.crowded(client):
        return min(body_timeout_s, crowded_s)
    return body_timeout_s


def body_timeout_middleware(
    timeout_s: float, limiter: ConnectionLimiter | None = None, crowded_s: float | None = None
) -> Callable:
    """A middleware that reads the whole request body in time (see the module), else answers
    408 in the route's error envelope and closes the connection.

    Handlers read the body with `request.read()`, which returns the copy read here.
    """

    @web.middleware
    async def read_body_in_time(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.can_read_body:
            loop = asyncio.get_running_loop()
            started = loop.time()
            read = asyncio.ensure_future(request.read())
            try:
                while not read.done():
                    limit_s = body_deadline_s(
                        limiter, request.remote or "?", timeout_s, crowded_s or timeout_s
                    )
                    left = started + limit_s - loop.time()
                    if left <= 0:
                        read.cancel()  # before the close below makes it fail
                        crowded = " (the server is near its connection limit)"
                        err = RequestTimeout(
                            f"The request body did not arrive within {limit_s:g} s"
                            + (crowded if limit_s < timeout_s else "")
                        )
                        return await _answer_and_close(request, err)
                    await asyncio.wait({read}, timeout=min(left, CHECK_S))
            finally:
                read.cancel()  # the client left (this task was cancelled): nothing reads it
            read.result()  # its failure (a broken body) is the error middleware's to answer
        return await handler(request)

    return read_body_in_time


async def _answer_and_close(request: web.Request, err: MlxdError) -> web.StreamResponse:
    log.info(
        "request failed: %s %s -> %d %s", request.method, request.path, err.status, err.message
    )
    resp = error_response(err, request)
    resp.force_close()
    await resp.prepare(request)
    await resp.write_eof()
    # The rest of the body is not coming: without this aiohttp would linger on the connection
    # for up to 10 s reading it. The answer is already written; close() flushes it first.
    request.protocol.force_close()
    return resp


def add_body_timeout(
    app: web.Application,
    timeout_s: float,
    limiter: ConnectionLimiter | None = None,
    crowded_s: float | None = None,
) -> None:
    """Add the body-deadline middleware innermost: the body is then read only for requests that
    passed the guard and auth (no stranger makes us buffer it), at the point where handlers
    would read it anyway, and its 408 goes through the error middleware's envelope."""
    app.middlewares.append(body_timeout_middleware(timeout_s, limiter, crowded_s))
