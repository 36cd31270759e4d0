"""The supervisor process: app assembly, start-up, and an ordered shutdown."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import psutil
from aiohttp import web

from mlxd.shared.config import Settings
from mlxd.shared.middleware import error_middleware, request_id_middleware

from . import routes
from .admin import add_admin_routes
from .auth import auth_middleware
from .builtin import setup_builtin
from .cors import add_cors, cors_middleware
from .metrics import add_metrics, observe_middleware
from .monitor import run_monitor
from .registry import Registry
from .responses import add_response_routes
from .upstream import UpstreamPool

log = logging.getLogger("mlxd.daemon")


def build_app(settings: Settings, registry: Registry) -> web.Application:
    # Outermost first: ids and metrics see every answer; CORS preflights skip auth; a refusal
    # from auth still gets the error envelope.
    app = web.Application(middlewares=[request_id_middleware, observe_middleware,
                                       cors_middleware, error_middleware, auth_middleware],
                          client_max_size=settings.max_body_bytes)
    app["settings"] = settings
    app["registry"] = registry
    add_response_routes(app)  # before the generic /v1 proxy route
    routes.add_routes(app)
    add_admin_routes(app)
    add_metrics(app)
    add_cors(app)
    return app


def prepare_home(settings: Settings) -> None:
    for d in (settings.models_dir, settings.logs_dir, settings.cache_dir):
        d.mkdir(parents=True, exist_ok=True)
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(settings.run_dir, 0o700)  # sockets live here: only this user may connect


async def serve(settings: Settings) -> int:
    """Run until SIGTERM or SIGINT, then shut down in order. Returns the exit code."""
    prepare_home(settings)
    registry = Registry(settings, UpstreamPool(),
                        total_memory_bytes=psutil.virtual_memory().total)
    app = build_app(settings, registry)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=settings.shutdown_grace_s)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    await site.start()
    (settings.run_dir / "mlxd.pid").write_text(str(os.getpid()))
    log.info("mlxd listening on http://%s:%d home=%s budget=%d bytes", settings.host,
             settings.port, settings.home_dir, registry.budget_bytes)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)  # handlers only flag; the work happens below
    monitor = asyncio.create_task(run_monitor(registry))
    setup_builtin(registry)
    preload(settings, registry)
    if registry.default_model():
        log.info("try: curl http://%s:%d/v1/chat/completions -H 'content-type: application/json'"
                 " -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}]}'",
                 settings.host, settings.port)

    await stop.wait()
    log.info("shutting down: stop accepting, finish in-flight requests, drain workers")
    monitor.cancel()
    await site.stop()
    await _wait_in_flight(registry, settings.shutdown_grace_s)
    await registry.shutdown()
    await runner.cleanup()
    (settings.run_dir / "mlxd.pid").unlink(missing_ok=True)
    log.info("stopped")
    return 0


def preload(settings: Settings, registry: Registry) -> None:
    """Start the models marked `preload` (they then follow their keep-alive like any other)."""
    for model_id, ms in settings.models.items():
        if ms.preload:
            registry.spawn_task(_preload_one(registry, model_id))


async def _preload_one(registry: Registry, model_id: str) -> None:
    try:
        slot = await registry.acquire(registry.resolve(model_id))
        registry.release(slot)
    except Exception as exc:
        log.error("preload of model=%s failed: %s", model_id, exc)


async def _wait_in_flight(registry: Registry, grace_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + grace_s
    while any(s.leases for s in registry.slots.values()):
        if asyncio.get_running_loop().time() >= deadline:
            log.warning("grace period over with requests in flight")
            return
        await asyncio.sleep(0.05)
