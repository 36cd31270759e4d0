"""A speech-to-text model's worker: the same socket, health and drain contract as a chat
worker, with one speech thread (speech/runner.py) in place of the engine."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from mlxd.shared.exit_codes import EXIT_MODEL_LOAD_ERROR, EXIT_OK, EXIT_PARENT_GONE
from mlxd.shared.middleware import error_middleware, request_id_middleware
from mlxd.shared.model_facts import ModelFacts
from mlxd.shared.routes import WORKER_AUDIO_PATHS
from mlxd.shared.worker_spec import WorkerSpec
from mlxd.worker.api import transcriptions as routes
from mlxd.worker.serving import open_socket, stop_events, unlink
from mlxd.worker.speech.load import load_speech

log = logging.getLogger("mlxd.worker")


def build_speech_app(state: routes.SpeechState) -> web.Application:
    # The body is PCM the supervisor decoded within its own bounds: room for the longest.
    app = web.Application(
        middlewares=[request_id_middleware, error_middleware],
        client_max_size=max(state.config.max_body_bytes, 128 * 1024 * 1024),
    )
    app["state"] = state
    app.router.add_get("/health", routes.health)
    app.router.add_get("/v1/models", routes.models)
    app.router.add_get("/stats", routes.stats)
    app.router.add_post("/admin/drain", routes.drain)
    for path in sorted(WORKER_AUDIO_PATHS):
        app.router.add_post(path, routes.audio)
    return app


async def serve_speech(cfg: WorkerSpec, facts: ModelFacts) -> int:
    """Bind, load the speech model, serve until SIGTERM; return the exit code."""
    state = routes.SpeechState(config=cfg, facts=facts)
    runner = await open_socket(build_speech_app(state), cfg.socket)
    log.info("listening model=%s socket=%s (speech-to-text)", cfg.model_id, cfg.socket)
    stop, parent_gone = stop_events(cfg)
    state.phase = "loading weights"
    try:
        state.model = await asyncio.to_thread(load_speech, cfg.model_path, cfg.model_id, facts)
    except Exception as exc:
        log.error("cannot load model=%s path=%s: %s", cfg.model_id, cfg.model_path, exc)
        await runner.cleanup()
        unlink(cfg.socket)
        return EXIT_MODEL_LOAD_ERROR
    state.runner.start()
    state.started = True
    log.info("ready model=%s (speech-to-text)", cfg.model_id)
    await stop.wait()
    state.draining = True
    if not parent_gone.is_set():
        await routes.wait_idle(state.runner, cfg.grace_s)
    await runner.shutdown()
    state.runner.stop()
    await asyncio.to_thread(state.runner.join, 30.0)
    await runner.cleanup()
    unlink(cfg.socket)
    return EXIT_PARENT_GONE if parent_gone.is_set() else EXIT_OK
