"""Who may call what: the API key on /v1, the admin token (or loopback) on /admin and /metrics.

- api_key set: every /v1 and /api (Ollama) route needs it, as `Authorization: Bearer <key>`
  or `x-api-key`.
- admin_token set: /admin and /metrics need `Authorization: Bearer <token>` from everyone;
  unset: they answer loopback clients only (403 otherwise). Ollama's routes that change the
  models on disk (/api/pull, /api/delete, /api/copy, /api/create) follow the same rule.
- /health is always open. A non-loopback bind without an api_key is refused unless
  `insecure` is set (see `bind_refusal`).
Secrets are compared with hmac.compare_digest (constant time).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging

from aiohttp import web
from pydantic import SecretStr

from mlxd.shared.config import Settings
from mlxd.shared.errors import MlxdError, Unauthorized
from mlxd.shared.routes import ADMIN_AREAS, API_AREAS, MANAGE_PATHS, in_area
from mlxd.supervisor.scheduling.keepalive import granted_keep_alive

log = logging.getLogger("mlxd.auth")


class Forbidden(MlxdError):
    status = 403
    type = "permission_error"
    anthropic_type = "permission_error"


def _secret(value: SecretStr | None) -> bytes:
    return value.get_secret_value().encode() if value is not None else b""


def _matches(secret: bytes, presented: list[str]) -> bool:
    ok = False
    for candidate in presented:  # every candidate is compared: no early exit to time
        ok |= hmac.compare_digest(secret, candidate.encode())
    return ok


def bearer(request: web.Request) -> str | None:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def is_loopback_ip(addr: str | None) -> bool:
    try:
        ip = ipaddress.ip_address((addr or "").split("%")[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def is_loopback_host(host: str) -> bool:
    """Whether binding `host` keeps the daemon reachable from this machine only."""
    return host.lower() == "localhost" or is_loopback_ip(host)


def bind_refusal(settings: Settings) -> str | None:
    """Why the daemon must not start with these settings (None: it may)."""
    if is_loopback_host(settings.host) or settings.insecure or _secret(settings.api_key):
        return None
    return (
        f"refusing to listen on {settings.host}: a non-loopback address needs an API key "
        "(set MLXD_API_KEY or api_key in config.toml), or pass --insecure"
    )


def insecure_warning(settings: Settings) -> str | None:
    """The warning to log when --insecure opens the API to the network without a key."""
    if is_loopback_host(settings.host) or _secret(settings.api_key):
        return None
    return (
        f"--insecure: the API on {settings.host}:{settings.port} is open to the network "
        "without an API key; anyone who can reach this port can use the models "
        "(set MLXD_API_KEY to require one)"
    )


def check_api_key(request: web.Request, settings: Settings) -> None:
    secret = _secret(settings.api_key)
    if not secret:
        return
    presented = [v for v in (bearer(request), request.headers.get("x-api-key")) if v]
    if not presented:
        raise Unauthorized("Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key'")
    if not _matches(secret, presented):
        raise Unauthorized("Invalid API key")


def check_admin(request: web.Request, settings: Settings) -> None:
    secret = _secret(settings.admin_token)
    if secret:
        token = bearer(request)
        if token is None or not _matches(secret, [token]):
            raise Unauthorized("The admin API needs 'Authorization: Bearer <admin token>'")
    elif not is_loopback_ip(request.remote):
        raise Forbidden(
            "The admin API answers loopback clients only; set MLXD_ADMIN_TOKEN to allow others"
        )


def is_admin(request: web.Request, settings: Settings) -> bool:
    """Whether the admin API would accept this request (the admin token, or loopback when
    none is set)."""
    try:
        check_admin(request, settings)
    except MlxdError:
        return False
    return True


def keep_alive_for(
    request: web.Request, settings: Settings, model_id: str, requested_s: float | None
) -> float | None:
    """An Ollama request's keep_alive as granted (scheduling/keepalive.py): a non-admin
    caller's that would unload the model sooner is ignored, and the request served as usual
    (Open WebUI and others send keep_alive with every chat)."""
    may_shorten = settings.api_keep_alive_unloads or is_admin(request, settings)
    configured_s = settings.for_model(model_id).keep_alive_s
    granted = granted_keep_alive(requested_s, configured_s, may_shorten)
    if granted != requested_s:
        log.info(
            "model=%s keep_alive %gs ignored: shorter than keep_alive_s, and not an admin caller",
            model_id,
            requested_s,
        )
    return granted


def request_areas(request: web.Request) -> set[str]:
    """Which protected areas the request touches: by its path and by the route it matched."""
    route = request.match_info.route if request.match_info is not None else None
    resource = route.resource if route is not None else None
    areas = set()
    for path in (request.path, resource.canonical if resource is not None else ""):
        if path in MANAGE_PATHS:  # they change what is on disk: the admin area's rule
            areas.add("admin")
        elif in_area(path, API_AREAS):
            areas.add("api")
        if in_area(path, ADMIN_AREAS):
            areas.add("admin")
    return areas


@web.middleware
async def auth_middleware(request: web.Request, handler):
    """Runs inside the error middleware, so a refusal gets the route's envelope."""
    settings: Settings = request.app["settings"]
    areas = request_areas(request)
    if "api" in areas:
        check_api_key(request, settings)
    if "admin" in areas:
        check_admin(request, settings)
    return await handler(request)
