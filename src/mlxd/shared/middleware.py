"""aiohttp middlewares shared by the supervisor and the worker: request ids and errors."""

from __future__ import annotations

import logging
import math
import uuid

from aiohttp import web
from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD

from mlxd.shared.errors import (
    BadRequest,
    MethodNotAllowed,
    MlxdError,
    NotFound,
    PayloadTooLarge,
    error_bytes,
)

log = logging.getLogger("mlxd.http")

REQUEST_ID = "x-request-id"

# The request body encodings aiohttp decodes here: br and zstd only with their packages
# installed (pyproject requires both), so the 400 names what this install really accepts.
BODY_ENCODINGS = (
    "gzip",
    "deflate",
    *(("br",) if HAS_BROTLI else ()),
    *(("zstd",) if HAS_ZSTD else ()),
)


@web.middleware
async def request_id_middleware(request: web.Request, handler):
    """Pass a client's x-request-id through, or make one; echo it on the response."""
    rid = request.headers.get(REQUEST_ID) or uuid.uuid4().hex
    request["request_id"] = rid
    resp = await handler(request)
    if not resp.prepared:
        resp.headers[REQUEST_ID] = rid
    return resp


def _from_http(exc: web.HTTPException | web.RequestPayloadError) -> MlxdError:
    if isinstance(exc, web.RequestPayloadError):
        # The body could not be read: an undecodable Content-Encoding, a broken chunked
        # encoding, a short body. aiohttp's text may name library internals: say it plainly.
        return BadRequest(
            "The request body could not be read: check its Content-Encoding "
            f"({', '.join(BODY_ENCODINGS)} are accepted) and its length"
        )
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return PayloadTooLarge("Request body is too large")
    if isinstance(exc, web.HTTPNotFound):
        return NotFound("Not found")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        return MethodNotAllowed(f"Method {exc.method} is not allowed here")
    err = BadRequest(exc.reason or "Bad request")
    err.status = exc.status
    return err


def error_response(err: MlxdError, request: web.Request) -> web.Response:
    resp = web.Response(
        status=err.status, body=error_bytes(err, request.path), content_type="application/json"
    )
    if request.can_read_body:
        # Refused before its body was read: the connection cannot carry another request
        # (the rest of the body is still on it), so tell the client to open a new one.
        resp.force_close()
    if "request_id" in request:
        resp.headers[REQUEST_ID] = request["request_id"]
    retry_after_s = getattr(err, "retry_after_s", None)
    if retry_after_s is not None:
        resp.headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return resp


@web.middleware
async def error_middleware(request: web.Request, handler):
    """Every failure becomes the route's error envelope; never a traceback."""
    try:
        return await handler(request)
    except MlxdError as err:
        log.info(
            "request failed: %s %s -> %d %s",
            request.method,
            request.path,
            err.status,
            err.message,
            extra={"request_id": request.get("request_id")},
        )
        return error_response(err, request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(_from_http(exc), request)
    except web.RequestPayloadError as exc:  # raised by request.read(), not an HTTPException
        return error_response(_from_http(exc), request)
    except ConnectionResetError:
        raise
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(MlxdError("Internal server error"), request)
