"""A speech model's worker routes: POST /v1/audio/transcriptions and /translations (the body
the supervisor made: parameters, then PCM), and its /health, /stats, /v1/models and drain.

Also the answer a chat or embedding model's worker gives on the audio routes (the supervisor
refuses those before any load; this is for a request that reaches a worker anyway).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from mlxd.shared.errors import BadRequest, Unavailable
from mlxd.shared.model_facts import ModelFacts, kind_refusal
from mlxd.shared.wire.admin import WorkerHealth
from mlxd.shared.wire.audio import unpack
from mlxd.shared.wire.memory import ModelMemory
from mlxd.shared.wire.openai_out import ModelCard, ModelList
from mlxd.shared.worker_spec import WorkerSpec
from mlxd.worker.chat.state import WorkerState
from mlxd.worker.speech.formats import render
from mlxd.worker.speech.load import SpeechModel
from mlxd.worker.speech.runner import SpeechRunner
from mlxd.worker.speech.transcribe import transcribe

log = logging.getLogger("mlxd.worker.speech")


@dataclass
class SpeechState:
    """What a speech worker's handlers share."""

    config: WorkerSpec
    facts: ModelFacts
    runner: SpeechRunner = field(default_factory=SpeechRunner)
    model: SpeechModel | None = None
    started: bool = False
    draining: bool = False
    phase: str = "starting"

    def ready(self) -> SpeechModel:
        if self.draining:
            raise Unavailable("This worker is draining and admits no new requests")
        if self.model is None or not self.started:
            raise Unavailable("The model is still loading")
        return self.model


def _json(data, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


def language_code(m: SpeechModel, language: str | None) -> str | None:
    """The Whisper code of an ISO-639-1 code or a language name; a 400 for any other."""
    if language is None:
        return None
    if language in m.languages:
        return language
    by_name = {name: code for code, name in m.languages.items()}
    if language in by_name:
        return by_name[language]
    raise BadRequest(
        f"Invalid 'language': '{language[:32]}' is not a language this model knows; send an "
        "ISO-639-1 code such as 'en' or 'de'",
        param="language",
    )


async def audio(request: web.Request) -> web.Response:
    """POST /v1/audio/transcriptions and /v1/audio/translations (the task is in the body)."""
    state: SpeechState = request.app["state"]
    m = state.ready()
    job, pcm = unpack(await request.read())
    job = job.model_copy(update={"language": language_code(m, job.language)})
    if not m.multilingual and job.language not in (None, "en"):
        raise BadRequest(
            f"The model '{m.model_id}' is English-only; it cannot take language '{job.language}'",
            param="language",
        )
    t0 = time.monotonic()
    out = await state.runner.submit(lambda: transcribe(m.model, pcm, job), job.duration_s)
    log.info(
        "transcribed model=%s task=%s seconds=%.1f in %.2fs segments=%d",
        m.model_id,
        job.task,
        job.duration_s,
        time.monotonic() - t0,
        len(out.segments),
    )
    body, content_type = render(job, out.text, out.language, out.segments, m.languages)
    return web.Response(body=body, headers={"Content-Type": content_type})


async def wrong_kind(request: web.Request) -> web.Response:
    """The audio routes on a chat or embedding model's worker: a 400 naming its routes."""
    state: WorkerState = request.app["state"]
    facts = state.facts
    why = kind_refusal(facts, state.config.model_id, "transcription") if facts else None
    raise BadRequest(why or "This worker does not serve audio", code="model_type_mismatch")


def _memory(state: SpeechState) -> ModelMemory:
    return ModelMemory(weights_bytes=state.model.weights_bytes if state.model else 0)


async def health(request: web.Request) -> web.Response:
    state: SpeechState = request.app["state"]
    cfg = state.config
    status, error = "ok", None
    if not state.started:
        status = "loading"
    elif state.runner.dead is not None:
        status, error = "failed", state.runner.dead  # the watchdog restarts this worker
    elif state.draining:
        status = "draining"
    body = WorkerHealth(
        status=status, pid=os.getpid(), generation=cfg.generation, model=cfg.model_id, error=error
    )
    if status == "loading":
        body.phase = state.phase
    if state.started:
        body.memory = _memory(state)
        body.memory_in_use_bytes = body.memory.total_bytes
    return _json(body.model_dump(exclude_none=True), status=200 if status == "ok" else 503)


async def models(request: web.Request) -> web.Response:
    state: SpeechState = request.app["state"]
    card = ModelCard(id=state.config.model_id, status="loaded", type="transcription")
    return _json(ModelList(data=[card]).model_dump())


async def stats(request: web.Request) -> web.Response:
    state: SpeechState = request.app["state"]
    r = state.runner
    return _json(
        {
            "model": state.config.model_id,
            "loaded": state.model is not None,
            "draining": state.draining,
            "active_rows": r.running,
            "queued_rows": r.queued,
            "transcriptions": r.completed,
            "transcriptions_failed": r.failed,
            "audio_seconds": round(r.audio_s, 3),
            "weights_bytes": _memory(state).weights_bytes,
        }
    )


async def wait_idle(runner: SpeechRunner, timeout_s: float) -> int:
    """Wait until nothing runs or waits (at most `timeout_s`); how many were in flight."""
    in_flight = runner.running + runner.queued
    deadline = time.monotonic() + timeout_s
    while runner.running + runner.queued and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return in_flight


async def drain(request: web.Request) -> web.Response:
    """Stop admitting; let queued and running transcriptions finish within the grace period."""
    state: SpeechState = request.app["state"]
    state.ready()
    state.draining = True
    in_flight = await wait_idle(state.runner, state.config.grace_s)
    return _json({"status": "drained", "in_flight": in_flight, "cache_persisted": False})
