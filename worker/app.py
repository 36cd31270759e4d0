"""The worker process: aiohttp on a UNIX socket in front of one engine thread."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time

import orjson
import psutil
from aiohttp import web

from mlxd.shared.errors import BadRequest
from mlxd.shared.exit_codes import EXIT_MODEL_LOAD_ERROR, EXIT_OK, EXIT_PARENT_GONE
from mlxd.shared.middleware import error_middleware, request_id_middleware
from mlxd.shared.wire.admin import WorkerHealth
from mlxd.shared.wire.bodies import load_json
from mlxd.shared.wire.openai import ModelCard, ModelList
from mlxd.worker.api import anthropic as anthropic_routes
from mlxd.worker.api import openai as openai_routes
from mlxd.worker.api import responses as responses_routes
from mlxd.worker.cache.layout import fingerprint, ssd_folder
from mlxd.worker.cache.prompt_cache import PromptCache, kv_layout
from mlxd.worker.config import WorkerConfig
from mlxd.worker.engine.loop import Engine
from mlxd.worker.lifeline import watch_parent
from mlxd.worker.model import load_model
from mlxd.worker.state import WorkerState

log = logging.getLogger("mlxd.worker")


def _json(data, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


async def health(request: web.Request) -> web.Response:
    """200 only while this worker serves; pid and generation let the supervisor check that
    the process on its socket is the one it started."""
    state: WorkerState = request.app["state"]
    cfg = state.config
    status, error = "ok", None
    if state.loaded is None or not state.started:
        status = "loading"
    elif state.engine is not None and state.engine.dead is not None:
        # Unhealthy on purpose: the supervisor's watchdog then restarts this worker.
        status, error = "failed", state.engine.dead
    elif state.draining:
        status = "draining"  # admits nothing: routing must not count it as serving
    body = WorkerHealth(
        status=status, pid=os.getpid(), generation=cfg.generation, model=cfg.model_id, error=error
    )
    return _json(body.model_dump(exclude_none=True), status=200 if status == "ok" else 503)


async def models(request: web.Request) -> web.Response:
    cfg: WorkerConfig = request.app["state"].config
    card = ModelCard(id=cfg.model_id, status="loaded")
    return _json(ModelList(data=[card]).model_dump())


async def stats(request: web.Request) -> web.Response:
    state: WorkerState = request.app["state"]
    body = {
        "model": state.config.model_id,
        "loaded": state.loaded is not None,
        "draining": state.draining,
    }
    if state.engine is not None:
        body.update(state.engine.stats())
    return _json(body)


@web.middleware
async def access_log(request: web.Request, handler):
    """One line per request, carrying the id the supervisor passed through.

    A request whose client left (the handler cancelled, or a write to a closed stream)
    logs status 499, nginx's "client closed request", with how far it got.
    """
    t0 = time.monotonic()
    try:
        resp = await handler(request)
    except (asyncio.CancelledError, ConnectionResetError):
        progress = request.get("progress")  # a ChatRun or RowProgress, once the row began
        log.info(
            "%s %s 499 %.3fs request_id=%s cancelled prompt_tokens=%d prompt_done=%d "
            "completion_tokens=%d",
            request.method,
            request.path,
            time.monotonic() - t0,
            request.get("request_id"),
            progress.gen.prompt_tokens if progress and progress.gen else 0,
            progress.prompt_done if progress else 0,
            progress.completion_tokens if progress else 0,
        )
        raise
    if request.path != "/health":
        log.info(
            "%s %s %d %.3fs request_id=%s",
            request.method,
            request.path,
            resp.status,
            time.monotonic() - t0,
            request.get("request_id"),
        )
    return resp


async def drain(request: web.Request) -> web.Response:
    """Stop admitting; let in-flight rows finish until the deadline, then cancel the rest."""
    state: WorkerState = request.app["state"]
    _, engine = state.ready()
    state.draining = True
    in_flight = engine.active_rows + engine.queued_rows
    cancelled_before = engine.cancellations
    await _wait_rows(engine, state.config.grace_s)
    cancelled = engine.cancel_all()
    await _wait_rows(engine, 5.0)
    persisted = await _persist(state)
    body = {
        "status": "drained",
        "in_flight": in_flight,
        "cancelled": cancelled,
        "cancellations": engine.cancellations - cancelled_before,
        **persisted,
    }
    log.info("drained model=%s %s", state.config.model_id, body)
    return _json(body)


async def _persist(state: WorkerState) -> dict:
    """Write every RAM cache entry to the SSD tier and make it durable.

    `cache_persisted` is true only when every write that ended meanwhile landed and the final
    fsync succeeded: a full disk or a tier turned off reports false, with the counts."""
    cache = state.prompt_cache
    if cache is None or cache.ssd is None or state.engine is None:
        return {"cache_persisted": False}
    written0, failed0 = cache.write_tally()
    try:
        queued = state.engine.persist_cache()
        await asyncio.to_thread(queued.wait, 30.0)
        durable = await asyncio.to_thread(cache.flush, 120.0)
    except Exception:  # the cache is an optimisation: a drain still answers
        log.exception("persisting the prompt cache failed")
        durable = False
    written, failed = cache.write_tally()
    failed -= failed0
    return {
        "cache_persisted": durable and failed == 0 and cache.ssd_writable,
        "cache_entries_written": written - written0,
        "cache_entries_failed": failed,
        "cache_ssd_entries": len(cache.ssd),
    }


async def cache_flush(request: web.Request) -> web.Response:
    """Make pending prompt-cache writes durable without stopping."""
    state: WorkerState = request.app["state"]
    state.ready()
    return _json({"status": "flushed", **await _persist(state)})


async def cache_session_close(request: web.Request) -> web.Response:
    """Drop a session's prompt-cache entries (RAM and SSD)."""
    state: WorkerState = request.app["state"]
    _, engine = state.ready()
    data = load_json(await request.read())
    session = data.get("session_id") or data.get("prompt_cache_key")
    if not isinstance(session, str) or not session:
        raise BadRequest("Invalid 'session_id': a non-empty string is required", param="session_id")
    done = engine.close_session(session)
    await asyncio.to_thread(done.wait, 10.0)
    return _json({"status": "closed", "session_id": session})


async def _wait_rows(engine: Engine, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while engine.active_rows + engine.queued_rows and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def build_app(state: WorkerState) -> web.Application:
    app = web.Application(
        middlewares=[request_id_middleware, access_log, error_middleware],
        client_max_size=state.config.max_body_bytes,
    )
    app["state"] = state
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/stats", stats)
    app.router.add_post("/admin/drain", drain)
    app.router.add_post("/admin/cache/flush", cache_flush)
    app.router.add_post("/admin/cache/session/close", cache_session_close)
    app.router.add_post("/v1/chat/completions", openai_routes.chat_completions)
    app.router.add_post("/v1/completions", openai_routes.completions)
    app.router.add_post("/v1/responses", responses_routes.responses)
    app.router.add_post("/v1/messages", anthropic_routes.messages)
    app.router.add_post("/v1/messages/count_tokens", anthropic_routes.count_tokens)
    return app


async def serve(cfg: WorkerConfig) -> int:
    """Bind the socket, load the model, serve until SIGTERM; return the exit code."""
    state = WorkerState(config=cfg)
    runner = web.AppRunner(build_app(state), handler_cancellation=True, access_log=None)
    await runner.setup()
    sock = cfg.socket
    sock.parent.mkdir(parents=True, exist_ok=True)
    if sock.exists() or sock.is_symlink():
        sock.unlink()  # a stale socket from a crashed worker
    old_umask = os.umask(0o177)  # the socket is created 0600
    try:
        await web.UnixSite(runner, str(sock)).start()
    finally:
        os.umask(old_umask)
    log.info("listening model=%s socket=%s", cfg.model_id, sock)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    exit_code = EXIT_OK
    parent_gone = asyncio.Event()
    if cfg.exit_with_parent:
        asyncio.create_task(watch_parent(parent_gone.set))
        asyncio.create_task(_set_when(parent_gone, stop))

    try:
        state.loaded = await asyncio.to_thread(
            load_model, cfg.model_path, cfg.model_id, cfg.context_limit
        )
    except Exception as exc:
        log.error("cannot load model=%s path=%s: %s", cfg.model_id, cfg.model_path, exc)
        await runner.cleanup()
        _unlink(sock)
        return EXIT_MODEL_LOAD_ERROR
    # The SSD scan can take a while on a big folder: off the loop, so /health answers
    # "loading" meanwhile, and READY (state.started) only once it and the engine are up.
    state.prompt_cache = await asyncio.to_thread(make_prompt_cache, cfg, state.loaded)
    state.engine = Engine(
        state.loaded, batch=cfg.batch, prefill_step=cfg.prefill_step, cache=state.prompt_cache
    )
    state.engine.debug_prefill_delay_s = cfg.debug_prefill_delay_s  # test-only (bridge.py)
    state.engine.start()
    state.started = True
    log.info(
        "ready model=%s context_limit=%d batch=%d",
        cfg.model_id,
        state.loaded.context_limit,
        cfg.batch,
    )

    await stop.wait()
    if parent_gone.is_set():
        exit_code = EXIT_PARENT_GONE
    await shutdown(state, runner, grace_s=0.0 if parent_gone.is_set() else cfg.grace_s)
    _unlink(sock)
    return exit_code


async def shutdown(state: WorkerState, runner: web.AppRunner, grace_s: float) -> None:
    """Stop admitting, let in-flight rows finish within the grace period, then stop."""
    state.draining = True
    log.info("stopping: %d rows in flight", state.engine.active_rows + state.engine.queued_rows)
    await _wait_rows(state.engine, grace_s)
    state.engine.cancel_all()  # past the grace period: nothing may keep the engine busy
    await _wait_rows(state.engine, 5.0)
    await _persist(state)  # the prompt cache outlives the process
    await runner.shutdown()  # closes idle keep-alive connections and cancels the rest
    state.engine.stop()
    # The engine thread must be gone before the interpreter exits (MLX aborts otherwise).
    await asyncio.to_thread(state.engine.join, 30.0)
    await runner.cleanup()


async def _set_when(trigger: asyncio.Event, target: asyncio.Event) -> None:
    await trigger.wait()
    target.set()


def _unlink(path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def make_prompt_cache(cfg: WorkerConfig, loaded) -> PromptCache | None:
    ram = cfg.prompt_cache_bytes
    if ram is None:
        ram = min(psutil.virtual_memory().total // 8, 16 * 1024**3)
    if ram == 0:
        return None  # --prompt-cache-bytes 0 turns the whole prompt cache off
    ssd_dir, layout = None, None
    if cfg.ssd_cache_dir is not None:
        ssd_dir = cfg.ssd_cache_dir / "unusable"  # where the tier would be if all else fails
        try:
            ssd_dir = ssd_folder(
                cfg.ssd_cache_dir, cfg.model_id, fingerprint(cfg.model_path, "kv-fp")
            )
            layout = kv_layout(loaded.model)  # what every SSD entry is checked against
        except Exception as exc:  # no layout: the tier turns itself off in start()
            log.warning("SSD prompt cache unusable for model=%s: %s", cfg.model_id, exc)
    cache = PromptCache(
        ram,
        ssd_dir,
        cfg.ssd_cache_bytes,
        layout=layout,
        quiet_s=cfg.cache_quiet_s,
        idle_s=cfg.cache_idle_s,
    )
    cache.start()
    return cache


def main(cfg: WorkerConfig) -> int:
    logging.basicConfig(
        level=os.environ.get("MLXD_LOG_LEVEL", "INFO"),
        format=f"%(asctime)s %(levelname)s [worker {cfg.model_id}] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        runner = asyncio.run
    return runner(serve(cfg))
