"""Wire bodies of the /admin API (docs/api.md, "Admin API"); mlxctl reads the same models."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from mlxd.shared.wire.memory import ModelMemory


class ModelStatus(BaseModel):
    """One model as GET /admin/models shows it (running or only discovered)."""

    id: str
    state: str  # stopped, starting, ready, draining, stopping, backoff, fatal
    adapters: list[str] = []  # the LoRA adapters it mounts, as requests name them
    source: str | None = None  # home, hf-cache, config (None: gone from disk since it loaded)
    path: str | None = None
    weights_bytes: int = 0
    footprint_bytes: int = 0  # what the budget counts: the worker's report, else the estimate
    # What it holds while a worker runs (None: none runs): the figure every view shows.
    memory: ModelMemory | None = None
    pid: int | None = None
    memory_bytes: int | None = None  # the worker process's resident set size (RSS): MLX's
    # buffers, the interpreter and libraries; a process figure, not what the budget counts
    leases: int = 0  # requests in flight
    queued: int = 0  # requests waiting for it to become ready
    idle_s: float | None = None  # seconds since the last request ended (None: never used)
    keep_alive_s: float = 0.0  # -1: never unloaded when idle
    expires_in_s: float | None = None  # keep-alive left (None: busy, pinned, or not running)
    restarts: int = 0
    last_error: str | None = None
    generation: int = 0  # hot reloads so far
    pinned: bool = False
    drained: bool = False  # refused until an explicit load or reload
    # A worker group's ranks (docs/scale-out.md): their pids, rank 0's first (`pid`); remote
    # ranks by their ssh client. `memory_bytes` then sums the ranks on this host.
    ranks: list[int] | None = None
    # While starting: what the worker is doing (its /health phase) and the seconds since the
    # load began; mlxctl load and the dashboard show both.
    phase: str | None = None
    load_s: float | None = None


class ModelDetail(ModelStatus):
    """GET /admin/models/{id}: the status row and what the daemon knows of the model."""

    settings: dict[str, Any] = {}  # its config section, unset keys filled from daemon-wide ones
    generation_config: dict[str, Any] = {}  # the folder's generation_config.json sampling keys
    architecture: dict[str, Any] = {}  # from config.json: model_type, context, quantization
    # What a request that leaves a field out gets (shared/sampling.py): temperature,
    # top_p, top_k, min_p, max_tokens (None: to the context's end), system (None: none).
    sampling_defaults: dict[str, Any] = {}


class ModelStatusList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelStatus]


class ModelAction(BaseModel):
    """The answer to POST /admin/models/{id}/{load,unload,drain,reload}."""

    id: str
    action: Literal["load", "unload", "drain", "reload"]
    result: str  # loaded, already loaded, unloaded, not running, drained, reloaded, reloaded cold
    elapsed_s: float
    model: ModelStatus
    drain: dict[str, Any] | None = None  # the worker's drain report, when it drained


class WorkerReply(BaseModel):
    """One worker's answer inside a fan-out (cache flush, stats)."""

    status: int | None = None  # HTTP status; None when the worker could not be reached
    body: dict[str, Any] = {}
    error: str | None = None


class FlushResult(BaseModel):
    object: Literal["cache.flush"] = "cache.flush"
    flushed: list[str]  # models whose worker flushed
    unsupported: list[str]  # workers without a flush route (404)
    failed: list[str]
    workers: dict[str, WorkerReply]


class SessionClose(BaseModel):
    """POST /admin/cache/session/close: which session, and what each loaded worker said."""

    object: Literal["cache.session.close"] = "cache.session.close"
    session_id: str
    workers: dict[str, WorkerReply]


class SupervisorStats(BaseModel):
    uptime_s: float
    budget_bytes: int
    models_loaded: int
    leases: int
    queued: int
    loads: int
    load_failures: int
    evictions: int
    unloads: int
    crashes: int
    reloads: int


class StatsResult(BaseModel):
    object: Literal["stats"] = "stats"
    supervisor: SupervisorStats
    workers: dict[str, WorkerReply]


class LogTail(BaseModel):
    """Lines of a worker's log file; pass `offset` back as `after` to follow it."""

    id: str
    file: str
    lines: list[str]
    offset: int  # the file size after the returned lines


class WorkerHealth(BaseModel):
    """A worker's GET /health answer: whether it serves, and who it is.

    The supervisor routes to a socket only when `pid` and `generation` are those of the
    process it started for that slot: a socket path can be answered by a stale worker."""

    status: str  # ok (200); loading, starting, draining, failed (503)
    pid: int | None = None
    generation: int | None = None
    model: str | None = None
    error: str | None = None  # why the engine stopped, when status is failed
    phase: str | None = None  # while loading: loading weights, warming up, ...
    # What the worker holds now (weights, RAM prompt cache, KV of the rows in flight) and the
    # memory plan's limit: what the supervisor's budget can count in place of an estimate.
    memory_in_use_bytes: int | None = None  # memory.total_bytes
    memory_limit_bytes: int | None = None
    memory: ModelMemory | None = None  # the parts (shared/wire/memory.py)


class MemoryModel(BaseModel):
    """One running model as GET /admin/memory shows it."""

    id: str
    state: str
    footprint_bytes: int  # what the budget counts for it: memory.total_bytes
    memory: ModelMemory
    memory_bytes: int | None = None  # its worker's resident set size (not what is counted)
    leases: int = 0
    pinned: bool = False
    idle_s: float | None = None
    evictable: bool = False  # an eviction could take it now (idle, ready, not pinned)


class MemoryReport(BaseModel):
    """GET /admin/memory: the budget, who holds it, and what an eviction would take first."""

    object: Literal["memory"] = "memory"
    budget_bytes: int
    used_bytes: int  # footprints of every running worker, hot-reload twins included
    free_bytes: int
    max_loaded_models: int  # 0: no limit
    models: list[MemoryModel]
    eviction_order: list[str]  # idle evictable models, the first one is evicted first


class FitScheme(BaseModel):
    """What one KV scheme makes room for, in GET /admin/fit."""

    kv_bits: int  # 16: the model's own float KV (see kv_dtype_bytes); 8 or 4: quantized
    bytes_per_token: int  # K and V over the full-attention layers
    windowed_bytes_per_token: int = 0  # over the sliding-window layers, up to `window` tokens
    window: int = 0  # their window, in tokens (0: none)
    state_bytes_per_row: int = 0  # the recurrent layers' fixed state, per row
    bytes_at_context: int = 0  # what one row of the whole context holds (unpadded)
    measured: bool = False  # the running worker's own figures, from its caches
    max_context_at_batch_1: int  # the longest row (prompt + output), at most the context
    max_batch_at_context: int  # rows of the whole context at once (the `batch` setting caps)
    fits_context: bool  # one row of the whole context fits


class FitLoaded(BaseModel):
    """The model's worker as it is now, in GET /admin/fit."""

    state: str
    footprint_bytes: int  # what the budget counts: memory.total_bytes
    reported: bool  # footprint_bytes is the worker's own report
    memory: ModelMemory
    memory_bytes: int | None = None  # the worker's resident set size
    memory_limit_bytes: int | None = None  # its memory plan's limit (worker /stats)
    kv_bits: int | None = None  # its KV scheme (16: float)
    kv_bytes_per_token: int | None = None  # full-attention layers (measured, as below)
    kv_windowed_bytes_per_token: int | None = None
    kv_window: int | None = None
    kv_state_bytes_per_row: int | None = None
    kv_budget_bytes: int | None = None
    kv_reserved_bytes: int | None = None  # what the rows in flight are counted at
    rows_active: int | None = None


class FitReport(BaseModel):
    """GET /admin/fit?model=ID: for this machine, what fits per KV scheme; what is loaded."""

    object: Literal["fit"] = "fit"
    model: str
    context_length: int  # the context a worker serves (the model's, within context_limit)
    batch: int  # the model's `batch` setting
    kv_bits: int  # the model's configured scheme (16: float)
    kv_group_size: int
    kv_dtype_bytes: int  # bytes of the float K and V (and of the scales when quantized)
    layers: int
    kv_heads: int  # of a full-attention layer (1 for an MLA latent)
    head_dim: int  # its K head dim (the latent's rank for MLA)
    attention_layers: int = 0  # layers whose KV grows with every token
    window_layers: int = 0  # sliding-window layers (FitScheme.window)
    state_layers: int = 0  # recurrent layers (a fixed state per row)
    machine_memory_bytes: int
    budget_bytes: int  # the supervisor's memory budget
    free_bytes: int  # the budget less what the other running models hold now
    weights_bytes: int  # the model's weight files
    prompt_cache_bytes: int  # the RAM prompt-cache cap the plan leaves
    headroom_bytes: int
    kv_budget_bytes: int  # what the plan leaves the rows in flight (the model alone)
    schemes: list[FitScheme]
    loaded: FitLoaded | None = None  # None: no worker runs for it
