"""The launch contract: everything one worker process needs, as one frozen pydantic model.

The supervisor builds a WorkerSpec from fully resolved per-model settings
(supervisor/lifecycle/launch.py) and starts `python -m mlxd.worker --spec '<json>'`; the worker
reads it back with the same model (worker/config.py, which also builds one from the standalone
flags). A command line is visible to every local user, so a spec never carries a secret: the
API key and the admin token stay in the supervisor.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mlxd.shared.images import ImageLimits
from mlxd.shared.sampling import NAMES as SAMPLING_NAMES
from mlxd.shared.sampling import SamplingFields

SPEC_FLAG = "--spec"

# Structured-output grammar bounds (docs/security.md): static caps, then the compile's bounds.
GRAMMAR_FIELDS = (
    "grammar_max_repeat",
    "grammar_max_bytes",
    "grammar_max_positions",
    "grammar_compile_timeout_s",
    "grammar_compile_memory_bytes",
    "grammar_compile_concurrency",
    "grammar_queue_timeout_s",
    "grammar_cache_bytes",
)
# Bounds on a request's images (shared/images.py, docs/security.md).
IMAGE_FIELDS = (
    "image_urls",
    "image_url_private",
    "image_max_count",
    "image_max_bytes",
    "image_max_pixels",
)
# A model's request defaults from its config section (over its generation_config.json).
MODEL_DEFAULT_FIELDS = (
    *SAMPLING_NAMES,
    "max_tokens",
    "system",
    "chat_template",
)
# Spec fields that are daemon-wide settings of the same name and meaning, copied as they are.
SAME_AS_SETTINGS = (
    "prefill_step",
    "prefill_budget",
    "prefill_target_s",
    "prefill_block",
    "attention_buckets",
    "kv_budget_bytes",
    "compile_decode",
    "first_token_from_prefill",
    "warmup",
    "max_body_bytes",
    "prompt_cache_bytes",
    "ssd_cache_bytes",
    "ssd_read_ahead",
    "stream_heartbeat_s",
    "strip_attribution_lines",
    "debug_prefill_delay_s",
    "step_log",
    "log_level",
    *GRAMMAR_FIELDS,
    *IMAGE_FIELDS,
)


def speculation_conflict(speculative: str, kv_bits: int | None, ranks: int) -> str | None:
    """Why a model's `speculative` setting could never run (None: it can). Drafts are verified
    and trimmed on a lone row's plain float cache, in one process."""
    if speculative == "off":
        return None
    if kv_bits is not None:
        return "speculative decoding runs on the float KV cache: drop kv_bits or turn it off"
    if ranks > 1:
        return "a worker group does not speculate: drop group_size/hosts or turn it off"
    return None


class GroupSpec(BaseModel):
    """This worker's place in a worker group (docs/scale-out.md): one rank of `size`, joined by
    mx.distributed over `backend`. Rank 0 serves the socket; the others follow it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    size: int = Field(ge=2)
    rank: int = Field(0, ge=0)
    backend: Literal["ring", "nccl"] = "ring"
    hosts: tuple[str, ...] = ()  # one address per rank, rank 0's first; empty: all on this host
    # ring: every rank's "ip:port", rank 0's first (the worker writes mlx.launch's hostfile
    # from them); nccl: none, the ranks meet at `coordinator` (rank 0's "ip:port").
    peers: tuple[str, ...] = ()
    coordinator: str | None = None
    # Rank 0's "ip:port" for the links (worker/group/channel.py): each iteration's events.
    link: str | None = None
    # nccl: which of its host's GPUs this rank runs on (its place among that host's ranks);
    # NCCL needs one GPU per rank. None: the process's default device (ring).
    device: int | None = Field(None, ge=0)


class WorkerSpec(SamplingFields):
    """One worker's model, socket, limits, caches and log level (see docs/worker.md); its
    SamplingFields are the model's config defaults (None: the folder's, else built-in)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_path: Path
    model_id: str
    socket: Path
    batch: int = Field(32, ge=1)
    context_limit: int | None = None  # None: the model's own
    prefill_step: int | None = Field(None, ge=16)  # ... while nothing decodes; None: by device
    prefill_budget: int | None = Field(None, ge=16)  # ... while rows decode; None: by device
    prefill_target_s: float | None = Field(None, ge=0, le=3600)  # busy step's time; None: by device
    prefill_block: int | None = Field(None, ge=0, le=4096)  # None or 0: off (CUDA only)
    attention_buckets: bool = True  # extending rows' attention in bucketed shapes (CUDA only)
    kv_budget_bytes: int | None = Field(None, ge=0)  # None: from memory; 0: no KV bound
    kv_bits: Literal[4, 8] | None = None  # quantized KV (None: the model's float dtype)
    kv_group_size: Literal[32, 64, 128] = 64  # elements sharing one scale and bias
    # The supervisor's share for this worker: its budget less what the other workers report
    # (estimates before they do), never below this model's estimate (None: the machine's
    # memory). The worker's memory plan fits weights, caches and KV within it.
    memory_limit_bytes: int | None = Field(None, ge=0)
    compile_decode: bool | None = None  # the decode forward compiled (None: on the CPU only)
    first_token_from_prefill: bool | None = None  # (None: with a GPU; worker/model/head.py)
    warmup: bool = True  # run the engine's shapes once before READY
    max_body_bytes: int = 32 * 1024 * 1024
    grace_s: float = 30.0
    exit_with_parent: bool = True
    enable_thinking: bool | None = None  # None: the chat template's own default
    model_type: Literal["chat", "embedding", "transcription"] | None = None  # None: detected
    prompt_cache_bytes: int | None = None  # None: sized from memory; 0: no prompt cache
    ssd_cache_dir: Path | None = None  # None: no SSD tier
    ssd_cache_bytes: int = 20 * 1024**3
    ssd_read_ahead: bool = True  # the newest SSD entries into RAM from the start (read_ahead.py)
    cache_quiet_s: float = 2.0
    cache_idle_s: float = 300.0
    generation: int = 0  # the supervisor's slot generation; /health reports it back
    stream_heartbeat_s: float = 10.0  # a quiet stream's protocol event interval (sse.Heartbeat)
    strip_attribution_lines: bool = True  # system text without them (worker/chat/canonical.py)
    debug_prefill_delay_s: float = 0.0  # test-only: hold the first token back this long
    step_log: Path | None = None  # one JSON line per engine step (worker/engine/steplog.py)
    log_level: str = "INFO"
    max_tokens: int | None = None  # None: up to the context's end
    system: str | None = None  # for requests without a system or developer message
    chat_template: str | None = None  # Jinja text or an absolute file path (the folder's: None)
    speculative: Literal["off", "ngram", "draft"] = "off"  # a lone row's drafting (speculate.py)
    draft_model: Path | None = None  # the draft model's folder, for "draft"
    num_draft_tokens: int = Field(4, ge=1, le=16)
    grammar_max_repeat: int = 1000
    grammar_max_bytes: int = 64 * 1024
    grammar_max_positions: int = 50_000
    grammar_compile_timeout_s: float = 30.0
    grammar_compile_memory_bytes: int = 2 * 1024**3
    grammar_compile_concurrency: int = Field(2, ge=1)
    grammar_queue_timeout_s: float = 10.0
    grammar_cache_bytes: int = 256 * 1024**2
    image_urls: bool = False  # fetch http(s) image URLs (off: inline images only)
    image_url_private: bool = False  # ... also from loopback, private and link-local addresses
    image_max_count: int = Field(16, ge=0)
    image_max_bytes: int = Field(20 * 1024**2, ge=1)
    image_max_pixels: int = Field(50_000_000, ge=1)
    group: GroupSpec | None = None  # None: a worker of its own
    # LoRA adapters mounted at start (name -> mlx-lm adapter folder), and the bytes of
    # adapter factors kept loaded (least recently used leave first).
    adapters: dict[str, Path] = {}
    adapter_cache_bytes: int = Field(2 * 1024**3, ge=0)

    @field_validator("log_level")
    @classmethod
    def _level_name(cls, value: str) -> str:
        # logging knows only upper-case names; `mlxd start --log-level debug` is fine too.
        return value.upper()

    @model_validator(mode="after")
    def _speculation_that_can_run(self):
        if self.speculative == "draft" and self.draft_model is None:
            raise ValueError('speculative "draft" needs a draft model (--draft-model)')
        if (why := speculation_conflict(self.speculative, self.kv_bits, ranks=1)) is not None:
            raise ValueError(why)
        return self

    @property
    def image_limits(self) -> ImageLimits:
        """What one request's images may cost on this worker (worker/chat/images.py)."""
        return ImageLimits(
            max_count=self.image_max_count,
            max_bytes=self.image_max_bytes,
            max_pixels=self.image_max_pixels,
            fetch_urls=self.image_urls,
            url_private=self.image_url_private,
        )

    def to_argv(self) -> list[str]:
        """The worker's arguments after `python -m mlxd.worker`."""
        return [SPEC_FLAG, self.model_dump_json()]

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> WorkerSpec:
        """The spec in a command line that `to_argv` made (the argument after --spec)."""
        args = list(argv)
        return cls.model_validate_json(args[args.index(SPEC_FLAG) + 1])
