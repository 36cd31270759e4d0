"""What a worker's spec asks for, built: the engine (batch, prefill plan, memory plan and KV
budget, speculative decoding) and the prompt cache (RAM cap, SSD folder and layout). Rank 0
(app.py) and a group's followers (group/follower.py) build theirs here alike."""

from __future__ import annotations

import logging
from collections.abc import Callable

import mlx.core as mx
import psutil

from mlxd.shared.memory_plan import plan_memory
from mlxd.shared.sizes import format_size
from mlxd.shared.worker_spec import WorkerSpec
from mlxd.worker.cache.kv_arrays import kv_layout
from mlxd.worker.cache.layout import fingerprint, ssd_folder
from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.engine import steplog
from mlxd.worker.engine.draft_model import spec_config
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.sched.planner import MIN_CHUNK, PlanConfig, window_chunk
from mlxd.worker.model import blocks
from mlxd.worker.model.device import on_cuda
from mlxd.worker.model.load import LoadedModel, apply_memory_limit, device_memory_bytes
from mlxd.worker.vision.load import VisionParts

log = logging.getLogger("mlxd.worker")

# The default idle prefill chunk (`prefill_step` unset) and busy-step budget (`prefill_budget`
# unset), by device: default_prefill().
GPU_PREFILL_STEP = 4096
CPU_PREFILL_STEP = 512
GPU_PREFILL_BUDGET = 4096
CPU_PREFILL_BUDGET = 1024
# A busy step's time target on the CPU (prefill_target_s unset): 512 prompt tokens deep in a
# long prompt took ~8 s a step on this project's 2-core machine, and each decoding row waited
# that long for every token. On a GPU the default budget's steps take tenths of a second.
CPU_STEP_TARGET_S = 1.0


def make_engine(
    cfg: WorkerSpec,
    loaded: LoadedModel,
    cache: PromptCache | None,
    draft: LoadedModel | None = None,
    engine_cls: Callable[..., Engine] = Engine,
    vision: VisionParts | None = None,
) -> Engine:
    """The engine with the spec's batch, prefill plan, KV budget and speculative decoding
    (docs/configuration.md); a draft model's weights count in the memory plan. `engine_cls`:
    a worker group's rank makes its own (worker/group/engine.py)."""
    default_idle, default_budget = default_prefill()
    cost = loaded.kv_cost
    window = cost.window if cost else 0
    # A set prefill_budget lifts the default idle chunk to it: a busy step never prefills
    # more than an idle one, and what was set is never cut by a default.
    idle = cfg.prefill_step or max(
        window_chunk(default_idle, window), min(cfg.prefill_budget or 0, default_idle)
    )
    budget_tokens = min(cfg.prefill_budget or window_chunk(default_budget, window), idle)
    target_s = cfg.prefill_target_s
    if target_s is None:
        target_s = CPU_STEP_TARGET_S if mx.default_device() == mx.cpu else 0.0
    if cfg.group is not None:
        target_s = 0.0  # the ranks plan alike, and a measured pace is each rank's own
    plan = PlanConfig(
        idle, budget_tokens, min(MIN_CHUNK, budget_tokens), blocks.block, step_target_s=target_s
    )
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
        "batch=%d prefill_step=%d prefill_budget=%d prefill_target_s=%g kv_budget=%s (%s; %s) "
        "memory_limit=%s warmup=%s",
        cfg.batch,
        plan.idle_chunk,
        plan.step_budget,
        plan.step_target_s,
        "none" if budget is None else format_size(budget),
        "no KV" if cost is None else cost.describe(),
        mem.explain(),
        format_size(mem.total_bytes),
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
        trace=steplog.open_step_log(
            cfg.step_log, cfg.model_id, follower=cfg.group is not None and cfg.group.rank > 0
        ),
        adapter_cache_bytes=cfg.adapter_cache_bytes,
        vision=vision,
        compile_decode=(
            cfg.compile_decode if cfg.compile_decode is not None else mx.default_device() == mx.cpu
        ),
        first_token_from_prefill=(
            cfg.first_token_from_prefill
            if cfg.first_token_from_prefill is not None
            else mx.default_device() != mx.cpu
        ),
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


def ram_cache_bytes(cfg: WorkerSpec, cuda_bytes: int | None = None) -> int:
    """The RAM prompt-cache cap: the spec's, else 1/8 of the memory its arrays live in, at
    most 16 GiB. That is RAM on a Mac (unified) and on the CPU, but a CUDA GPU's own memory
    (`cuda_bytes`, asked of the device when None): there the tier's arrays sit on the card, and
    an eighth of a 128 GiB host took 16 GiB of an 80 GiB H100, which ran another process on
    the card out of memory."""
    if cfg.prompt_cache_bytes is not None:
        return cfg.prompt_cache_bytes
    if cuda_bytes is None and on_cuda():
        cuda_bytes = device_memory_bytes()
    total = cuda_bytes if cuda_bytes else psutil.virtual_memory().total
    return min(total // 8, 16 * 1024**3)


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
