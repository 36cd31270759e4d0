"""CORS for browser clients: off unless `cors_origins` lists origins ("*": any, on /v1 only).

Which origins may call at all is the guard's rule (guard.py; /admin never takes one).
Preflights (OPTIONS with Access-Control-Request-Method) from an allowed origin are answered
here, before authentication (browsers send no credentials on a preflight). Every response to
an allowed origin, streams included, gets Access-Control-Allow-Origin just before its headers
go out (the on_response_prepare signal).
"""

from __future__ import annotations

from aiohttp import web

from mlxd.supervisor.http.auth import request_areas
from mlxd.supervisor.http.guard import listed_origin

ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
DEFAULT_ALLOW_HEADERS = (
    "authorization, content-type, x-api-key, x-request-id, "
    "anthropic-version, anthropic-beta, openai-organization"
)
MAX_AGE_S = 600


def allowed_origin(request: web.Request) -> str | None:
    """The request's Origin when `cors_origins` lets it call this route (never /admin)."""
    origin = request.headers.get("Origin")
    if not origin or not listed_origin(origin, request_areas(request), request.app["settings"]):
        return None
    return origin


@web.middleware
async def cors_middleware(request: web.Request, handler):
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        origin = allowed_origin(request)
        if origin is not None:
            asked = request.headers.get("Access-Control-Request-Headers")
            return web.Response(
                status=204,
                headers={
                    "Access-Control-Allow-Methods": ALLOW_METHODS,
                    "Access-Control-Allow-Headers": asked or DEFAULT_ALLOW_HEADERS,
                    "Access-Control-Max-Age": str(MAX_AGE_S),
                },
            )
    return await handler(request)


async def _add_headers(request: web.Request, response: web.StreamResponse) -> None:
    origin = allowed_origin(request)
    if origin is not None:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = "x-request-id"
        response.headers.add("Vary", "Origin")


def add_cors(app: web.Application) -> None:
    """Hook the response headers; the app also needs cors_middleware (before auth)."""
    app.on_response_prepare.append(_add_headers)
