"""mlxd settings: command-line flags over MLXD_* environment over $MLXD_HOME/config.toml.

The only module besides the entry points that reads the environment (MLXD_* through
pydantic-settings; HF_HUB_CACHE / HF_HOME for `hf_cache_dir`). Per-model sections live under
`[models."<id>"]` in the TOML file; `Settings.for_model` resolves one against the daemon-wide
settings, and the supervisor hands workers only resolved values (shared/worker_spec.py).
Reading and checking them (`load_settings`) is shared/config_load.py.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from mlxd.shared.images import IMAGE_BYTES_CEILING
from mlxd.shared.model_settings import ModelSettings, ResolvedModelSettings
from mlxd.shared.sizes import Bytes

MiB = 1024 * 1024
# Per-model settings that fall back to the daemon-wide setting of the same name when unset.
MODEL_FALLBACKS = ("keep_alive_s", "batch", "context_limit", "kv_allowance_bytes")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class ConfigError(ValueError):
    """A settings mistake (unknown key, bad value, missing file), said in one line."""


def _hf_cache_default() -> Path:
    """The Hugging Face hub cache, found as the hub itself finds it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME") or "~/.cache/huggingface").expanduser() / "hub"


class Settings(BaseSettings):
    """Every daemon setting; see docs/configuration.md."""

    model_config = SettingsConfigDict(env_prefix="MLXD_", extra="ignore", env_nested_delimiter="__")

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    home: Path = Path("~/.mlxd")
    log_level: str = "INFO"

    default_model: str | None = None
    models: dict[str, ModelSettings] = {}
    discover_hf_cache: bool = True
    # Where discovery looks; default: $HF_HUB_CACHE, else $HF_HOME/hub, else
    # ~/.cache/huggingface/hub.
    hf_cache_dir: Path = Field(default_factory=_hf_cache_default)

    # Lifecycle
    keep_alive_s: float = 300.0  # 0 unloads as soon as idle, -1 never
    max_loaded_models: int = Field(0, ge=0)  # 0: no limit but memory
    memory_budget_bytes: Bytes | None = Field(None, ge=0)  # default: memory_fraction of RAM
    memory_fraction: float = Field(0.75, gt=0, le=1)
    kv_allowance_bytes: Bytes = Field(512 * MiB, ge=0)
    max_concurrent_loads: int = Field(1, ge=1)
    load_timeout_s: float = Field(300.0, gt=0)
    queue_size: int = Field(64, ge=0)
    queue_timeout_s: float = Field(300.0, gt=0)
    min_residency_s: float = Field(0.0, ge=0)  # a fresh model is not evicted before this
    backoff_initial_s: float = Field(1.0, ge=0)
    backoff_max_s: float = Field(60.0, ge=0)
    crash_limit: int = Field(5, ge=1)
    crash_window_s: float = Field(600.0, gt=0)
    health_interval_s: float = Field(5.0, gt=0)
    watchdog_timeout_s: float = Field(30.0, gt=0)
    drain_timeout_s: float = Field(30.0, ge=0)
    shutdown_grace_s: float = Field(30.0, ge=0)
    stop_timeout_s: float = Field(10.0, gt=0)

    # Worker defaults
    batch: int = Field(32, ge=1)
    context_limit: int | None = Field(None, ge=16)
    # Prefill tokens per step: prefill_step while nothing decodes (None: 4096 on a GPU, 512
    # on the CPU), prefill_budget while rows decode or a new row joins a running prefill
    # (None: 4096 on a GPU, 1024 on the CPU). A model with sliding windows of 1024+ tokens
    # takes its window for both where it is smaller (engine/sched/planner.py window_chunk).
    prefill_step: int | None = Field(None, ge=16)
    prefill_budget: int | None = Field(None, ge=16)
    # A busy step's wall-time target in seconds: its prefill shrinks to what the measured
    # pace does in that time (None: 1.0 on the CPU, off on a GPU; 0: off).
    prefill_target_s: float | None = Field(None, ge=0, le=3600)
    # Prefill in whole blocks of this many tokens on CUDA (None or 0: off; 256 is the value
    # to try): cuDNN then builds a few attention graphs instead of one per prompt history.
    prefill_block: int | None = Field(None, ge=0, le=4096)
    # On CUDA, rows extending cached prefixes attend in bucketed shapes, so cuDNN builds a
    # graph per bucket, not per session length (worker/model/shape_buckets.py).
    attention_buckets: bool = True
    kv_budget_bytes: Bytes | None = Field(None, ge=0)  # None: from memory; 0: rows bound by batch
    # Compile the decode forward once per shape (engine/compiled.py). None: on the CPU only,
    # where it measured faster; on the H200 it won at batch 8 on a 0.6B model and lost on 8B.
    compile_decode: bool | None = None
    # A row's first token from its prefill forward (worker/model/head.py). None: with a GPU
    # (one decode forward fewer per newcomer); the CPU keeps mlx-lm's order, where the last
    # layer's extra positions cost more than that forward.
    first_token_from_prefill: bool | None = None
    warmup: bool = True  # run the engine's shapes once before READY
    # A quiet stream (a long prefill) sends a protocol event this often, not just a comment:
    # coding agents' idle watchdogs count only events (docs/coding-agents.md).
    stream_heartbeat_s: float = Field(10.0, gt=0)
    # Take Claude Code's per-session `x-anthropic-billing-header:` line out of system text
    # before rendering: left in, each new session misses the prompt cache from its ~20th
    # token (docs/coding-agents.md). False renders the text as sent.
    strip_attribution_lines: bool = True
    # Test-only (undocumented): hold each chat request's first token back this long, to
    # stand for a slow prefill in tests/e2e/test_coding_agents.py.
    debug_prefill_delay_s: float = Field(0.0, ge=0)
    # Each worker appends one JSON line per engine step here (docs/operations.md; bench steps)
    step_log: Path | None = None

    # Prompt cache (per worker)
    prompt_cache_bytes: Bytes | None = Field(None, ge=0)  # RAM tier; None: sized from memory
    ssd_cache: bool = True  # SSD tier under $MLXD_HOME/cache
    ssd_cache_bytes: Bytes = Field(20 * 1024**3, ge=0)
    # From the start, beside the warm-up: the newest SSD entries into the RAM tier's room
    ssd_read_ahead: bool = True

    # Structured-output grammars (per worker; docs/security.md): static caps before a compile,
    # then each compile's bounds in its child process. Every WorkerSpec copies them.
    grammar_max_repeat: int = Field(1000, ge=1)  # {m,n}, minLength, maxItems, …
    grammar_max_bytes: Bytes = Field(64 * 1024, ge=1)  # regex, grammar or schema text
    grammar_max_positions: int = Field(50_000, ge=1)  # regex size, repetitions counted out
    grammar_compile_timeout_s: float = Field(30.0, gt=0)
    grammar_compile_memory_bytes: Bytes = Field(2 * 1024**3, ge=16 * MiB)
    grammar_compile_concurrency: int = Field(2, ge=1)  # more wait, then 503
    grammar_queue_timeout_s: float = Field(10.0, ge=0)
    grammar_cache_bytes: Bytes = Field(256 * MiB, ge=0)  # compiled grammars, LRU

    # Images in requests (per worker; docs/security.md): bounds checked before any decode.
    # image_urls lets workers fetch http(s) image URLs; off, only inline (base64) images.
    image_urls: bool = False
    image_url_private: bool = False  # URLs may also reach loopback/private/link-local hosts
    image_max_count: int = Field(16, ge=0)  # images per request
    image_max_bytes: Bytes = Field(20 * MiB, ge=1, le=IMAGE_BYTES_CEILING)  # one image, encoded
    image_max_pixels: int = Field(50_000_000, ge=1)  # one image's width × height

    # Responses API store under $MLXD_HOME/responses (TTL 0: kept until the byte cap)
    responses_ttl_s: float = Field(30 * 24 * 3600.0, ge=0)
    responses_max_bytes: Bytes = Field(256 * MiB, ge=0)

    # HTTP
    max_body_bytes: Bytes = Field(32 * MiB, ge=1024)
    cors_origins: list[str] = []  # browser origins allowed to call the API ("*" for any)
    # Host header names served besides loopback names, IP literals and the bind host ("*": any);
    # anything else is refused, so a DNS-rebinding page cannot pass for a local client.
    allowed_hosts: list[str] = []
    # Connection bounds on the public port (docs/security.md). header_timeout_s runs from the
    # connection's start or its previous response, so it also ends idle keep-alive connections.
    max_connections: int = Field(1024, ge=1)  # kept below the descriptor limit at start
    max_connections_per_client: int = Field(256, ge=1)  # per peer address
    header_timeout_s: float = Field(15.0, gt=0)
    body_timeout_s: float = Field(60.0, gt=0)  # for the whole request body

    # Security (docs/api.md): a non-loopback bind needs api_key unless insecure is set
    api_key: SecretStr | None = None  # required on every /v1 route when set
    admin_token: SecretStr | None = None  # required on /admin and /metrics when set
    insecure: bool = False
    # Ollama's keep_alive unloads a model (0) or shortens its stay: true lets any API caller do
    # it, as Ollama does; false (default) only callers the admin API accepts (docs/security.md).
    api_keep_alive_unloads: bool = False

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if value.upper() not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return value.upper()

    # -- derived -------------------------------------------------------------------------
    @property
    def home_dir(self) -> Path:
        return self.home.expanduser()

    @property
    def models_dir(self) -> Path:
        return self.home_dir / "models"

    @property
    def run_dir(self) -> Path:
        return self.home_dir / "run"

    @property
    def logs_dir(self) -> Path:
        return self.home_dir / "logs"

    @property
    def cache_dir(self) -> Path:
        return self.home_dir / "cache"

    def for_model(self, model_id: str) -> ResolvedModelSettings:
        """`model_id`'s section, resolved: every unset MODEL_FALLBACKS field holds the
        daemon-wide value (context_limit may stay None: the model's own; enable_thinking
        stays None: the template's default)."""
        ms = self.models.get(model_id) or ModelSettings()
        unset = {f: getattr(self, f) for f in MODEL_FALLBACKS if getattr(ms, f) is None}
        adapters = {**ms.adapters, **self.adapter_ids(model_id)}
        return ResolvedModelSettings(**{**ms.model_dump(), **unset, "adapters": adapters})

    def adapter_ids(self, base: str) -> dict[str, Path]:
        """The model ids configured as `base` with an adapter, and their adapter folders."""
        return {
            mid: ms.adapter_path
            for mid, ms in self.models.items()
            if ms.base == base and ms.adapter_path is not None
        }

    def alias_map(self) -> dict[str, str]:
        """Every configured alias and the model id it names."""
        return {alias: mid for mid, ms in self.models.items() for alias in ms.aliases}


def is_template_text(value: str) -> bool:
    """A `chat_template` value that is Jinja text itself, not the name of a file."""
    return "{{" in value or "{%" in value
