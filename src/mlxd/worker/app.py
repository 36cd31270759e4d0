"""The worker process: aiohttp on a UNIX socket in front of one engine thread."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

import mlx.core as mx
from aiohttp import web

from mlxd.shared.exit_codes import EXIT_MODEL_LOAD_ERROR, EXIT_OK, EXIT_PARENT_GONE
from mlxd.shared.middleware import error_middleware, request_id_middleware
from mlxd.shared.model_facts import read_model_facts
from mlxd.shared.routes import WORKER_PATHS
from mlxd.shared.worker_spec import WorkerSpec
from mlxd.worker import cpu_blas
from mlxd.worker.api import anthropic as anthropic_routes
from mlxd.worker.api import completions as completions_routes
from mlxd.worker.api import control
from mlxd.worker.api import embeddings as embeddings_routes
from mlxd.worker.api import ollama as ollama_routes
from mlxd.worker.api import openai as openai_routes
from mlxd.worker.api import responses as responses_routes
from mlxd.worker.api import transcriptions as transcriptions_routes
from mlxd.worker.api.adapters import add_adapter_routes, mount_configured
from mlxd.worker.cache.keys import read_once
from mlxd.worker.cache.read_ahead import read_ahead
from mlxd.worker.chat.state import WorkerState
from mlxd.worker.embed.load import load_embedder
from mlxd.worker.engine.assemble import make_engine, make_prompt_cache
from mlxd.worker.engine.draft_model import load_draft
from mlxd.worker.follower import run_follower
from mlxd.worker.group.lead import GROUP_IDLE_S, GROUP_OFF, join_as_lead, lead_engine
from mlxd.worker.model.load import limit_buffer_cache, load_for_spec
from mlxd.worker.serving import open_socket, stop_events, unlink
from mlxd.worker.speech_app import serve_speech
from mlxd.worker.vision.load import load_vision

log = logging.getLogger("mlxd.worker")
POLLED_PATHS = frozenset({"/health", "/stats"})


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
    # Polled routes (the watchdog's /health, /stats for the dashboard and /metrics every few
    # seconds, a starting worker's /health much more often) would fill the log: debug only.
    log.log(
        logging.DEBUG if request.path in POLLED_PATHS else logging.INFO,
        "%s %s %d %.3fs request_id=%s",
        request.method,
        request.path,
        resp.status,
        time.monotonic() - t0,
        request.get("request_id"),
    )
    return resp


# The writer of each worker path in the shared route table (shared/routes.py); a path the
# table adds without a writer here fails at import, not at the first request.
GENERATION_HANDLERS = {
    "/v1/chat/completions": openai_routes.chat_completions,
    "/v1/completions": completions_routes.completions,
    "/v1/responses": responses_routes.responses,
    "/v1/messages": anthropic_routes.messages,
    "/v1/messages/count_tokens": anthropic_routes.count_tokens,
    "/v1/embeddings": embeddings_routes.embeddings,
    "/v1/audio/transcriptions": transcriptions_routes.wrong_kind,
    "/v1/audio/translations": transcriptions_routes.wrong_kind,
    "/api/chat": ollama_routes.chat,
    "/api/generate": ollama_routes.generate,
}
assert set(GENERATION_HANDLERS) == WORKER_PATHS, set(GENERATION_HANDLERS) ^ WORKER_PATHS


def build_app(state: WorkerState) -> web.Application:
    app = web.Application(
        middlewares=[
            request_id_middleware,
            access_log,
            error_middleware,
            embeddings_routes.kind_guard,
        ],
        client_max_size=state.config.max_body_bytes,
    )
    app["state"] = state
    app.router.add_get("/health", control.health)
    app.router.add_get("/v1/models", control.models)
    app.router.add_get("/stats", control.stats)
    app.router.add_post("/admin/drain", control.drain)
    app.router.add_post("/admin/cache/flush", control.cache_flush)
    app.router.add_post("/admin/cache/rescan", control.cache_rescan)
    app.router.add_post("/admin/cache/session/close", control.cache_session_close)
    add_adapter_routes(app)
    for path in sorted(WORKER_PATHS):  # the shared route table: one writer per surface
        app.router.add_post(path, GENERATION_HANDLERS[path])
    return app


async def serve(cfg: WorkerSpec) -> int:
    """Bind the socket, load the model, serve until SIGTERM; return the exit code."""
    facts = read_model_facts(cfg.model_path, cfg.model_id, cfg.model_type)
    if facts.type == "transcription":  # its own app: no engine, no prompt cache
        return await serve_speech(cfg, facts)
    state = WorkerState(config=cfg, facts=facts)
    sock = cfg.socket
    runner = await open_socket(build_app(state), sock)
    log.info("listening model=%s socket=%s", cfg.model_id, sock)
    stop, parent_gone = stop_events(cfg)
    exit_code = EXIT_OK
    embedding = facts.type == "embedding"
    if embedding:  # no chat rows: no prompt cache, no decode warm-up (docs/api.md)
        cfg = cfg.model_copy(update={"prompt_cache_bytes": 0, "warmup": False})
    channel = None  # a worker group's rank 0 (worker/group/)
    if cfg.group is not None:
        cfg = cfg.model_copy(update={"cache_idle_s": GROUP_IDLE_S, **GROUP_OFF})
        _phase(state, "joining the worker group")
        channel, code = await asyncio.to_thread(join_as_lead, cfg, embedding)
        if channel is None:
            await runner.cleanup()
            unlink(sock)
            return code
    _phase(state, "loading weights")
    try:
        if embedding:
            state.loaded = await asyncio.to_thread(
                load_embedder, cfg.model_path, cfg.model_id, facts, cfg.context_limit
            )
        else:
            group = channel.group if channel else None
            state.loaded = await asyncio.to_thread(load_for_spec, cfg, group)
            if facts.vision and group is None:  # a group's followers have no vision tower
                _phase(state, "loading the vision tower")
                state.vision = await asyncio.to_thread(
                    load_vision, cfg.model_path, state.loaded.model, state.loaded.tokenizer
                )
            if cfg.speculative == "draft" and cfg.draft_model is not None:
                _phase(state, "loading the draft model")
                state.draft = await asyncio.to_thread(load_draft, cfg.draft_model, state.loaded)
    except Exception as exc:
        log.error("cannot load model=%s path=%s: %s", cfg.model_id, cfg.model_path, exc)
        await runner.cleanup()
        unlink(sock)
        return EXIT_MODEL_LOAD_ERROR
    # The SSD scan can take a while on a big folder: off the loop, so /health answers
    # "loading" meanwhile, and READY (state.started) only once it and the engine are up.
    _phase(state, "opening the prompt cache")
    state.prompt_cache = await asyncio.to_thread(make_prompt_cache, cfg, state.loaded)
    limit_buffer_cache()
    state.engine = make_engine(
        cfg,
        state.loaded,
        state.prompt_cache,
        state.draft,
        engine_cls=lead_engine(channel),
        vision=state.vision,
    )
    # test-only slow prefill, read by api/generation.py
    state.engine.debug_prefill_delay_s = cfg.debug_prefill_delay_s
    state.engine.start()
    # The SSD tier's newest entries are read back into RAM from here on, the first beside the
    # warm-up (cache/read_ahead.py). A group's ranks each hold a shard of every entry: one
    # rank alone must not warm its RAM.
    ahead: asyncio.Task | None = None
    if cfg.ssd_read_ahead and cfg.group is None:
        ahead = asyncio.create_task(read_ahead(state, read_once))
    # The warm-up runs on the engine thread; READY only after it, so no user pays for it
    # (the supervisor's load time includes it).
    _phase(state, "warming up")
    await asyncio.to_thread(state.engine.warmed.wait)
    _phase(state, "mounting adapters")
    await mount_configured(state)
    state.started = True
    log.info(
        "ready model=%s context_limit=%d batch=%d",
        cfg.model_id,
        state.loaded.context_limit,
        cfg.batch,
    )
    await stop.wait()
    if ahead is not None:
        ahead.cancel()
    if parent_gone.is_set():
        exit_code = EXIT_PARENT_GONE
    await shutdown(state, runner, grace_s=0.0 if parent_gone.is_set() else cfg.grace_s)
    unlink(sock)
    return exit_code


async def shutdown(state: WorkerState, runner: web.AppRunner, grace_s: float) -> None:
    """Stop admitting, let in-flight rows finish within the grace period, then stop."""
    engine = state.engine
    assert engine is not None  # serve() gets here only after it made the engine
    state.draining = True
    log.info("stopping: %d rows in flight", engine.active_rows + engine.queued_rows)
    await control.wait_rows(engine, grace_s)
    engine.cancel_all()  # past the grace period: nothing may keep the engine busy
    await control.wait_rows(engine, 5.0)
    await control.persist(state)  # the prompt cache outlives the process
    await runner.shutdown()  # closes idle keep-alive connections and cancels the rest
    engine.stop()
    # The engine thread must be gone before the interpreter exits (MLX aborts otherwise).
    await asyncio.to_thread(engine.join, 30.0)
    await runner.cleanup()


def _phase(state: WorkerState, phase: str) -> None:
    """Enter a start-up phase: /health reports it until READY."""
    state.phase = phase
    log.info("start-up phase: %s model=%s", phase, state.config.model_id)


def main(cfg: WorkerSpec) -> int:
    """Log at the spec's level (the daemon's `log_level` reaches every worker) and serve."""
    logging.basicConfig(
        level=cfg.log_level,
        format=f"%(asctime)s %(levelname)s [worker {cfg.model_id}] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    log.debug("spec %s", cfg.model_dump_json())
    if line := cpu_blas.startup_line(os.environ, mx.default_device() == mx.cpu):
        log.info("%s", line)
    if cfg.group is not None and cfg.group.rank > 0:  # a follower rank serves no socket
        return run_follower(cfg)
    runner: Callable[[Coroutine[Any, Any, int]], int]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        runner = asyncio.run
    return runner(serve(cfg))
