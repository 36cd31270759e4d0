"""The worker process: aiohttp on a UNIX socket in front of one engine thread."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

import mlx.core as mx
import psutil
from aiohttp import web

from mlxd.shared.exit_codes import EXIT_MODEL_LOAD_ERROR, EXIT_OK, EXIT_PARENT_GONE
from mlxd.shared.memory_plan import plan_memory
from mlxd.shared.middleware import error_middleware, request_id_middleware
from mlxd.shared.model_facts import read_model_facts
from mlxd.shared.worker_spec import WorkerSpec
from mlxd.worker.api import anthropic as anthropic_routes
from mlxd.worker.api import completions as completions_routes
from mlxd.worker.api import control
from mlxd.worker.api import embeddings as embeddings_routes
from mlxd.worker.api import ollama as ollama_routes
from mlxd.worker.api import openai as openai_routes
from mlxd.worker.api import responses as responses_routes
from mlxd.worker.cache.layout import fingerprint, ssd_folder
from mlxd.worker.cache.prompt_cache import PromptCache, kv_layout
from mlxd.worker.draft_model import load_draft, spec_config
from mlxd.worker.embed.load import load_embedder
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.planner import MIN_CHUNK, PlanConfig
from mlxd.worker.group.follower import run_follower
from mlxd.worker.group.lead import GROUP_IDLE_S, GROUP_OFF, join_as_lead, lead_engine
from mlxd.worker.lifeline import watch_parent
from mlxd.worker.model import (
    LoadedModel,
    apply_memory_limit,
    device_memory_bytes,
    limit_buffer_cache,
    load_for_spec,
)
from mlxd.worker.state import WorkerState

log = logging.getLogger("mlxd.worker")

# The default idle prefill chunk (`prefill_step` unset) and busy-step budget (`prefill_budget`
# unset), by device: default_prefill().
GPU_PREFILL_STEP = 4096
CPU_PREFILL_STEP = 512
GPU_PREFILL_BUDGET = 4096
CPU_PREFILL_BUDGET = 1024


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
    app.router.add_post("/admin/cache/session/close", control.cache_session_close)
    app.router.add_post("/v1/chat/completions", openai_routes.chat_completions)
    app.router.add_post("/v1/completions", completions_routes.completions)
    app.router.add_post("/v1/responses", responses_routes.responses)
    app.router.add_post("/v1/messages", anthropic_routes.messages)
    app.router.add_post("/v1/messages/count_tokens", anthropic_routes.count_tokens)
    app.router.add_post("/v1/embeddings", embeddings_routes.embeddings)
    app.router.add_post("/api/chat", ollama_routes.chat)
    app.router.add_post("/api/generate", ollama_routes.generate)
    return app


async def serve(cfg: WorkerSpec) -> int:
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

    state.facts = read_model_facts(cfg.model_path, cfg.model_id, cfg.model_type)
    embedding = state.facts.type == "embedding"
    if embedding:  # no chat rows: no prompt cache, no decode warm-up (docs/api.md)
        cfg = cfg.model_copy(update={"prompt_cache_bytes": 0, "warmup": False})
    channel = None  # a worker group's rank 0 (worker/group/)
    if cfg.group is not None:
        cfg = cfg.model_copy(update={"cache_idle_s": GROUP_IDLE_S, **GROUP_OFF})
        channel, code = await asyncio.to_thread(join_as_lead, cfg, embedding)
        if channel is None:
            await runner.cleanup()
            _unlink(sock)
            return code
    try:
        if embedding:
            state.loaded = await asyncio.to_thread(
                load_embedder, cfg.model_path, cfg.model_id, state.facts, cfg.context_limit
            )
        else:
            group = channel.group if channel else None
            state.loaded = await asyncio.to_thread(load_for_spec, cfg, group)
            if cfg.speculative == "draft" and cfg.draft_model is not None:
                state.draft = await asyncio.to_thread(load_draft, cfg.draft_model, state.loaded)
    except Exception as exc:
        log.error("cannot load model=%s path=%s: %s", cfg.model_id, cfg.model_path, exc)
        await runner.cleanup()
        _unlink(sock)
        return EXIT_MODEL_LOAD_ERROR
    # The SSD scan can take a while on a big folder: off the loop, so /health answers
    # "loading" meanwhile, and READY (state.started) only once it and the engine are up.
    state.prompt_cache = await asyncio.to_thread(make_prompt_cache, cfg, state.loaded)
    limit_buffer_cache()
    state.engine = make_engine(
        cfg, state.loaded, state.prompt_cache, state.draft, engine_cls=lead_engine(channel)
    )
    # test-only slow prefill, read by api/generation.py
    state.engine.debug_prefill_delay_s = cfg.debug_prefill_delay_s
    state.engine.start()
    # The warm-up runs on the engine thread; READY only after it, so no user pays for it
    # (the supervisor's load time includes it).
    await asyncio.to_thread(state.engine.warmed.wait)
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
    await control.wait_rows(state.engine, grace_s)
    state.engine.cancel_all()  # past the grace period: nothing may keep the engine busy
    await control.wait_rows(state.engine, 5.0)
    await control.persist(state)  # the prompt cache outlives the process
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


def make_engine(
    cfg: WorkerSpec,
    loaded: LoadedModel,
    cache: PromptCache | None,
    draft: LoadedModel | None = None,
    engine_cls: Callable[..., Engine] = Engine,
) -> Engine:
    """The engine with the spec's batch, prefill plan, KV budget and speculative decoding
    (docs/configuration.md); a draft model's weights count in the memory plan. `engine_cls`:
    a worker group's rank makes its own (worker/group/engine.py)."""
    default_idle, default_budget = default_prefill()
    idle = cfg.prefill_step or default_idle
    # A busy step never prefills more than an idle one.
    budget_tokens = min(cfg.prefill_budget or default_budget, idle)
    plan = PlanConfig(idle, budget_tokens, min(MIN_CHUNK, budget_tokens))
    bpt = loaded.kv_bytes_per_token
    mem = plan_memory(
        machine_bytes=device_memory_bytes(),
        share_bytes=cfg.memory_limit_bytes,
        weights_bytes=loaded.weights_bytes + (draft.weights_bytes if draft else 0),
        prompt_cache_bytes=ram_cache_bytes(cfg) if cache is not None else 0,
        kv_budget_bytes=cfg.kv_budget_bytes,
    )
    apply_memory_limit(mem.total_bytes)
    if cache is not None and mem.prompt_cache_bytes < cache.ram.cap_bytes:
        cache.ram.cap_bytes = mem.prompt_cache_bytes  # the share left less room (still empty)
    # The setting's 0 means no KV bound; a plan that leaves 0 refuses every row (a 413).
    budget = None if mem.kv_source != "plan" and not mem.kv_budget_bytes else mem.kv_budget_bytes
    log.info(
        "batch=%d prefill_step=%d prefill_budget=%d kv_budget=%s (%s bytes per token; %s) "
        "memory_limit=%.2f GiB warmup=%s",
        cfg.batch,
        plan.idle_chunk,
        plan.step_budget,
        "none" if budget is None else f"{budget / 1024**3:.2f} GiB",
        bpt,
        mem.explain(),
        mem.total_bytes / 1024**3,
        cfg.warmup,
    )
    return engine_cls(
        loaded,
        batch=cfg.batch,
        plan=plan,
        kv_budget_bytes=budget,
        cache=cache,
        warmup=cfg.warmup,
        memory_plan=mem,
        spec=spec_config(cfg.speculative, cfg.num_draft_tokens, draft),
    )


def default_prefill() -> tuple[int, int]:
    """(idle chunk, busy-step budget) by device. On a GPU, large chunks win (fewer forwards,
    syncs and KV copies; attention is one fused kernel), and a busy step of 4096 tokens costs
    decoding rows little: 8 newcomers of 512 tokens are prefilled in one step, as mlx-lm's
    server does. MLX's CPU attention scores the whole chunk-by-context square, masked part
    included: there a 2k prompt in one chunk took 1.6x as long as in 512-token chunks, and a
    busy step stays at 1024 tokens so decoding rows keep moving."""
    if mx.default_device() == mx.cpu:
        return CPU_PREFILL_STEP, CPU_PREFILL_BUDGET
    return GPU_PREFILL_STEP, GPU_PREFILL_BUDGET


def ram_cache_bytes(cfg: WorkerSpec) -> int:
    """The RAM prompt-cache cap: the spec's, else 1/8 of RAM and at most 16 GiB."""
    if cfg.prompt_cache_bytes is not None:
        return cfg.prompt_cache_bytes
    return min(psutil.virtual_memory().total // 8, 16 * 1024**3)


def make_prompt_cache(cfg: WorkerSpec, loaded) -> PromptCache | None:
    ram = ram_cache_bytes(cfg)
    if ram == 0:
        return None  # --prompt-cache-bytes 0 turns the whole prompt cache off
    ssd_dir, layout = None, None
    if cfg.ssd_cache_dir is not None:
        ssd_dir = cfg.ssd_cache_dir / "unusable"  # where the tier would be if all else fails
        try:
            ssd_dir = ssd_folder(
                cfg.ssd_cache_dir, cfg.model_id, fingerprint(cfg.model_path, loaded.kv.name)
            )
            if cfg.group is not None:  # each rank keeps its own shard of every entry
                ssd_dir = ssd_dir / f"rank{cfg.group.rank}-of-{cfg.group.size}"
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


def main(cfg: WorkerSpec) -> int:
    """Log at the spec's level (the daemon's `log_level` reaches every worker) and serve."""
    logging.basicConfig(
        level=cfg.log_level,
        format=f"%(asctime)s %(levelname)s [worker {cfg.model_id}] %(name)s: %(message)s",
        stream=sys.stderr,
    )
    log.debug("spec %s", cfg.model_dump_json())
    if cfg.group is not None and cfg.group.rank > 0:  # a follower rank serves no socket
        return run_follower(cfg)
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
        runner = asyncio.run
    return runner(serve(cfg))
