"""The supervisor process: app assembly, start-up, and an ordered shutdown."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal

from aiohttp import web

from mlxd import __version__
from mlxd.shared.config import Settings
from mlxd.shared.middleware import error_middleware, request_id_middleware
from mlxd.shared.sizes import format_size
from mlxd.supervisor.admin.fit import add_fit_route
from mlxd.supervisor.admin.logstream import add_log_stream
from mlxd.supervisor.admin.memory import add_memory_route
from mlxd.supervisor.admin.metrics import add_metrics, observe_middleware
from mlxd.supervisor.admin.routes import add_admin_routes
from mlxd.supervisor.catalog.builtin import setup_builtin
from mlxd.supervisor.ctl import urlfile
from mlxd.supervisor.homedir import make_private_dir, prepare_home_dirs, set_private_umask
from mlxd.supervisor.http import routes
from mlxd.supervisor.http.auth import auth_middleware, insecure_warning
from mlxd.supervisor.http.body_deadline import add_body_timeout
from mlxd.supervisor.http.cors import add_cors, cors_middleware
from mlxd.supervisor.http.guard import guard_middleware
from mlxd.supervisor.http.limits import (
    ConnectionLimiter,
    GuardedTCPSite,
    connection_cap,
    raise_nofile_limit,
)
from mlxd.supervisor.http.responses import add_response_routes
from mlxd.supervisor.http.serverlog import SERVER_LOG
from mlxd.supervisor.lifecycle.upstream import UpstreamPool
from mlxd.supervisor.lifecycle.watchdog import run_watchdog
from mlxd.supervisor.machine import cuda_card_bytes, ram_bytes
from mlxd.supervisor.pidlock import PidLock
from mlxd.supervisor.registry.registry import Registry
from mlxd.supervisor.scheduling.keepalive import run_keepalive
from mlxd.supervisor.ui.routes import add_ui_routes

log = logging.getLogger("mlxd.daemon")


class StartupError(Exception):
    """The daemon cannot start (its port is taken, …); `mlxd start` says why in one line."""


def build_app(settings: Settings, registry: Registry) -> web.Application:
    # Outermost first: ids and metrics see every answer; every refusal below gets the error
    # envelope; the guard (path, Host, Origin, Content-Type) refuses before CORS answers a
    # preflight; CORS preflights skip auth.
    app = web.Application(
        middlewares=[
            request_id_middleware,
            observe_middleware,
            error_middleware,
            guard_middleware,
            cors_middleware,
            auth_middleware,
        ],
        client_max_size=settings.max_body_bytes,
    )
    app["settings"] = settings
    app["registry"] = registry
    add_response_routes(app)  # before the generic /v1 proxy route
    routes.add_routes(app)
    add_admin_routes(app)
    add_metrics(app)
    add_memory_route(app)  # the dashboard's: /admin/memory, /admin/logs/stream, /ui
    add_fit_route(app)  # /admin/fit?model=ID
    add_log_stream(app)
    add_ui_routes(app)
    add_cors(app)
    return app


def prepare_home(settings: Settings) -> PidLock:
    """Claim the home for this daemon: owner-only modes, then the one-daemon-per-home lock.

    Sets the process umask to 077 (workers inherit it), creates the folders 0700, tightens what
    older runs left readable, and takes the pid-file lock. Raises HomeLocked, before any socket
    or worker is touched, when another daemon runs on this home.
    """
    set_private_umask()
    make_private_dir(settings.run_dir)  # sockets and the lock live here: only this user
    lock = PidLock.acquire(settings.run_dir, settings.home_dir)
    try:
        prepare_home_dirs(settings.home_dir)
    except BaseException:
        lock.release()
        raise
    return lock


async def serve(settings: Settings, lock: PidLock | None = None) -> int:
    """Run until SIGTERM or SIGINT, then shut down in order. Returns the exit code.

    `lock` is the home's lock when the caller already took it with prepare_home.
    """
    lock = lock or prepare_home(settings)
    before, nofile = raise_nofile_limit()
    max_total = connection_cap(settings.max_connections, nofile)
    card = cuda_card_bytes()
    registry = Registry.build(
        settings, UpstreamPool(), total_memory_bytes=ram_bytes(), card_bytes=card
    )
    registry.catalog.apply_folder_settings()  # created models' own mlxd.json
    app = build_app(settings, registry)
    limiter = ConnectionLimiter(max_total, settings.max_connections_per_client)
    add_body_timeout(app, settings.body_timeout_s, limiter, settings.header_timeout_s)
    # aiohttp's keep-alive timer starts when a connection opens and again after each response,
    # and closes the connection if no complete request head arrived by then: the header timeout.
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        logger=SERVER_LOG,  # a request aiohttp cannot parse: one line, not a traceback
        shutdown_timeout=settings.shutdown_grace_s,
        keepalive_timeout=settings.header_timeout_s,
        # A request refused before its body was read closes its connection
        # (shared/middleware.py): no point reading the rest of a body
        # nobody will use, nor decoding a broken one into the log.
        lingering_time=0,
    )
    await runner.setup()
    site = GuardedTCPSite(runner, settings.host, settings.port, limiter)
    try:
        await site.start()
    except OSError as exc:  # before any line is logged: the one line is the error
        await runner.cleanup()
        lock.release()
        code = exc.errno or 0
        reason = os.strerror(code) if code in errno.errorcode else str(exc)
        raise StartupError(
            f"cannot listen on {settings.host}:{settings.port}: {reason}"
            + (" (another mlxd? choose one with --port)" if exc.errno == errno.EADDRINUSE else "")
        ) from None
    url = urlfile.client_url(settings.host, site.port)
    urlfile.write(settings.run_dir, url)
    _log_start(settings, before, nofile, max_total)
    log.info(
        "mlxd listening on http://%s:%d home=%s budget=%s%s",
        settings.host,
        site.port,
        settings.home_dir,
        format_size(registry.lifecycle.budget_bytes),
        f" (CUDA card {format_size(card)})" if card else "",
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)  # handlers only flag; the work happens below
    duties = [
        asyncio.create_task(run_keepalive(registry.lifecycle)),
        asyncio.create_task(run_watchdog(registry.lifecycle)),
    ]
    setup_builtin(registry.catalog, registry.tasks)
    preload(settings, registry)
    catalog = registry.catalog
    default = catalog.default_model()
    # Plain lines on stdout for whoever started it (make run, a terminal, a service log).
    print(
        banner(url, default, default in catalog.pending, settings.api_key is not None),
        flush=True,
    )

    await stop.wait()
    log.info("shutting down: stop accepting, finish in-flight requests, drain workers")
    for duty in duties:
        duty.cancel()
    await site.stop()
    await _wait_in_flight(registry, settings.shutdown_grace_s)
    await registry.shutdown()
    await runner.cleanup()
    urlfile.remove(settings.run_dir, url)
    lock.release()
    log.info("stopped")
    return 0


QUESTION = '{"messages": [{"role": "user", "content": "What is the capital of France?"}]}'


def banner(url: str, default_model: str | None, importing: bool, needs_key: bool) -> str:
    """What `mlxd start` prints once it listens: where it serves, the dashboard, the default
    model, and a request to try (README.md's, at this daemon's real address)."""
    lines = [f"mlxd {__version__}: serving on {url} (Ctrl-C stops)", f"  dashboard: {url}/ui"]
    if default_model is None:
        lines.append("  no default model: name one in each request (mlxctl models lists them)")
        return "\n".join(lines)
    note = " (importing it now, once: progress below; the first request waits)"
    lines.append(f"  default model: {default_model}{note if importing else ''}")
    key = ' -H "authorization: Bearer $MLXD_API_KEY"' if needs_key else ""
    lines.append(
        f"  try: curl {url}/v1/chat/completions{key} -H 'content-type: application/json'"
        f" -d '{QUESTION}'"
    )
    return "\n".join(lines)


def _log_start(settings: Settings, before: int, nofile: int, max_total: int) -> None:
    if (warning := insecure_warning(settings)) is not None:
        log.warning(warning)
    log.info(
        "descriptor limit %d (was %d); connections at most %d, %d per client",
        nofile,
        before,
        max_total,
        settings.max_connections_per_client,
    )
    if max_total < settings.max_connections:
        log.warning(
            "max_connections lowered from %d to %d to stay under the descriptor limit",
            settings.max_connections,
            max_total,
        )


def preload(settings: Settings, registry: Registry) -> None:
    """Start the models marked `preload` (they then follow their keep-alive like any other)."""
    for model_id, ms in settings.models.items():
        if ms.preload:
            registry.tasks.spawn(_preload_one(registry, model_id))


async def _preload_one(registry: Registry, model_id: str) -> None:
    try:
        slot = await registry.leases.acquire(registry.catalog.resolve(model_id))
        registry.leases.release(slot)
    except Exception as exc:
        log.error("preload of model=%s failed: %s", model_id, exc)


async def _wait_in_flight(registry: Registry, grace_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + grace_s
    while any(s.leases for s in registry.lifecycle.slots.values()):
        if asyncio.get_running_loop().time() >= deadline:
            log.warning("grace period over with requests in flight")
            return
        await asyncio.sleep(0.05)
