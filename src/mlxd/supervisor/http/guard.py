"""What may reach the supervisor's routes at all: the raw path, the Host, the Origin, the body type.

- Path: dot segments (`.`, `..`, also percent-encoded, alone or with an encoded `/`) and
  backslashes (also `%5c`) are refused with 400, on the raw request target, before any route
  sees it. An encoded `/` alone passes: model ids are `org/name`.
- Host (DNS rebinding): loopback names, `*.localhost`, IP literals, the bind host and the
  `allowed_hosts` setting ("*": any). A missing Host (HTTP/1.0 tools) is let through.
- Origin (cross-site pages): none, or the daemon's own origin, or one listed in `cors_origins`
  ("*" counts on /v1 only). /admin and /metrics take no cross-origin call whatever the list says,
  nor one a browser marks `Sec-Fetch-Site: cross-site`.
- Content-Type on POST: JSON or none; form-encoded only without an Origin (curl's `-d`);
  multipart/form-data on the audio routes, whose uploads are files.
  A browser sends text/plain or a form cross-site without a CORS preflight, so those are 415.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import unquote, urlsplit

from aiohttp import web

from mlxd.shared.config import Settings
from mlxd.shared.errors import BadRequest, MlxdError, NotFound
from mlxd.shared.middleware import BODY_ENCODINGS
from mlxd.shared.routes import WORKER_AUDIO_PATHS
from mlxd.supervisor.http.auth import Forbidden, request_areas

MAX_ECHOED_PATH = 200  # a 404 names the path, up to this many characters
FORM = "application/x-www-form-urlencoded"
AUDIO_TYPE = "Unsupported Content-Type"
SEND = "send the audio file as multipart/form-data (a 'file' part and the other fields)"


class UnsupportedMediaType(MlxdError):
    status = 415
    type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


def path_refusal(raw_path: str) -> str | None:
    """Why this raw request target must not be routed (None: it may)."""
    path = raw_path.split("?", 1)[0].split("#", 1)[0]
    lowered = path.lower()
    if "\\" in path or "%5c" in lowered:
        return "Invalid path: '\\' is not allowed"
    # An encoded '/' may stay (the SDKs send `org%2Fname` model ids, and a worker only ever
    # gets its route's own path), but no decoding of the path may produce a dot segment.
    # unquote twice: a doubly encoded dot (%252e) must not slip through a later decode.
    for candidate in (lowered, unquote(lowered), unquote(unquote(lowered))):
        if any(s in (".", "..") for s in candidate.split("/")):
            return "Invalid path: '.' and '..' segments are not allowed"
    return None


def host_name(host: str) -> str:
    """The name part of a Host value (or an Origin's netloc): no port, no brackets, lowercase."""
    host = host.strip().lower()
    if host.startswith("["):  # "[::1]:8080"
        end = host.find("]")
        return host[1:end] if end > 0 else host
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.removesuffix(".")  # "localhost." is localhost


def host_allowed(name: str, settings: Settings) -> bool:
    """Whether a request naming `name` as its host is meant for this daemon."""
    allowed = {host_name(h) for h in settings.allowed_hosts}
    if "*" in allowed or name == "localhost" or name.endswith(".localhost"):
        return True
    # A rebinding attack needs a name the attacker controls; an IP literal never is one, so
    # `http://192.168.1.5:8080` keeps working on a LAN bind without any setting.
    if _is_ip(name):
        return True
    return name == host_name(settings.host) or name in allowed


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.split("%", 1)[0])  # "fe80::1%en0" carries a zone
    except ValueError:
        return False
    return True


def same_origin(origin: str, settings: Settings, own_port: int) -> bool:
    """Whether `origin` is the daemon itself: http, an allowed host, the daemon's port."""
    try:
        parts = urlsplit(origin)
        port = parts.port or 80
    except ValueError:
        return False
    return (
        parts.scheme == "http"
        and parts.hostname is not None
        and bool(parts.hostname)
        and port == own_port
        and host_allowed(host_name(parts.hostname), settings)
    )


def listed_origin(origin: str, areas: set[str], settings: Settings) -> bool:
    """Whether `cors_origins` lets another site's page call a route in `areas`."""
    if "admin" in areas:  # operator routes never answer another page, listed or not
        return False
    listed = settings.cors_origins
    return origin in listed or ("*" in listed and "api" in areas)


def origin_allowed(
    origin: str, areas: set[str], settings: Settings, own_port: int, host: str | None = None
) -> bool:
    """Whether a request carrying `Origin: origin` may reach a route in `areas`.

    An origin naming the request's own Host is the page the daemon served, reached through a
    port forward or a reverse proxy (the Host itself passed the allow-list first)."""
    if host and _authority(origin) == host.strip().lower():
        return True
    return same_origin(origin, settings, own_port) or listed_origin(origin, areas, settings)


def _authority(origin: str) -> str | None:
    try:
        parts = urlsplit(origin)
    except ValueError:
        return None
    return parts.netloc.lower() if parts.scheme in ("http", "https") else None


def content_type_refusal(method: str, headers, path: str = "") -> str | None:
    """Why a POST body of this type is refused (None: it is JSON, absent, or curl's form;
    multipart on the audio routes)."""
    if method != "POST":
        return None
    raw = headers.get("Content-Type", "")
    mime = raw.split(";", 1)[0].strip().lower()
    if path in WORKER_AUDIO_PATHS:
        return None if mime == "multipart/form-data" else f"{AUDIO_TYPE} '{mime[:100]}': {SEND}"
    if not mime or mime == "application/json":
        return None
    if mime.startswith("application/") and mime.endswith("+json"):
        return None
    if mime == FORM and "Origin" not in headers:  # browsers always send Origin on a POST
        return None
    return (
        f"Unsupported Content-Type '{mime[:100]}': send 'Content-Type: application/json' "
        "with a JSON body"
    )


def encoding_refusal(headers) -> str | None:
    """Why a body's Content-Encoding is refused (None: absent, identity, or one coding mlxd
    decodes). aiohttp passes a list of codings, or one it does not know, through undecoded,
    and the JSON parser's complaint would then hide the cause."""
    raw = headers.get("Content-Encoding")
    if raw is None:
        return None
    coding = raw.strip().lower()
    if coding in ("", "identity") or coding in BODY_ENCODINGS:
        return None
    return (
        f"Unsupported Content-Encoding '{raw.strip()[:60]}': send one of "
        f"{', '.join(BODY_ENCODINGS)}, or none"
    )


def own_port(request: web.Request) -> int:
    """The port this connection reached (the setting's, when the socket does not say)."""
    transport = request.transport
    sock = transport.get_extra_info("sockname") if transport is not None else None
    if isinstance(sock, tuple) and len(sock) >= 2 and isinstance(sock[1], int):
        return sock[1]
    return request.app["settings"].port


def check_request(request: web.Request) -> None:
    """Raise the refusal for a request that must not reach its route."""
    settings: Settings = request.app["settings"]
    if (why := path_refusal(request.raw_path)) is not None:
        raise BadRequest(why)
    host = request.headers.get("Host")
    if host and host.strip() and not host_allowed(host_name(host), settings):
        raise Forbidden(
            f"Host '{host_name(host)[:100]}' is not served here; add it to "
            "allowed_hosts (MLXD_ALLOWED_HOSTS) to allow it"
        )
    areas = request_areas(request)
    origin = request.headers.get("Origin")
    if origin is not None and not origin_allowed(origin, areas, settings, own_port(request), host):
        raise Forbidden(
            "Cross-origin requests to this route are not allowed"
            + ("" if "admin" in areas else "; list the origin in cors_origins")
        )
    if "admin" in areas and request.headers.get("Sec-Fetch-Site") == "cross-site":
        raise Forbidden("Cross-site requests to the admin API are not allowed")
    matched = request.match_info.http_exception is None
    why = content_type_refusal(request.method, request.headers, request.path)
    if matched and why is not None:
        raise UnsupportedMediaType(why)
    if matched and (why := encoding_refusal(request.headers)) is not None:
        raise UnsupportedMediaType(why)


@web.middleware
async def guard_middleware(request: web.Request, handler):
    """Refuse what must not reach a route; name the path of a route that does not exist.

    Runs inside the error middleware (refusals get the route's envelope) and outside CORS (a
    preflight from a refused origin is refused too) and auth (an unknown path still asks for
    the key first, then answers 404).
    """
    check_request(request)
    try:
        return await handler(request)
    except web.HTTPNotFound:
        if request.match_info.http_exception is None:
            raise  # a route's own 404 passes unchanged
        path = request.path[:MAX_ECHOED_PATH]
        raise NotFound(f"Unknown path '{path}'", code="unknown_url") from None
