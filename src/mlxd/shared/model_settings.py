"""One model's settings: a `[models."<id>"]` section of the daemon's settings (config.py), and
the same section with the daemon-wide fallbacks filled in."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from mlxd.shared.sampling import SamplingFields
from mlxd.shared.sizes import Bytes
from mlxd.shared.worker_spec import speculation_conflict


class ModelSettings(SamplingFields):
    """One `[models."<id>"]` section. Unset fields fall back to the daemon-wide ones
    (`Settings.for_model` fills them in); its SamplingFields are the model's request defaults."""

    model_config = ConfigDict(extra="forbid")

    path: Path | None = None
    pinned: bool = False
    preload: bool = False
    default: bool = False
    keep_alive_s: float | None = None
    batch: int | None = Field(None, ge=1)
    context_limit: int | None = Field(None, ge=16)
    kv_allowance_bytes: Bytes | None = Field(None, ge=0)
    kv_bits: Literal[4, 8] | None = None  # quantized KV cache (None: the model's float dtype)
    kv_group_size: Literal[32, 64, 128] = 64  # KV elements sharing one scale and bias
    enable_thinking: bool | None = None  # None: the chat template's default
    type: Literal["chat", "embedding", "transcription"] | None = (
        None  # None: detected (model_facts)
    )
    # Request defaults (docs/configuration.md): a request's own value wins; unset ones fall back
    # to the folder's generation_config.json, then to the built-in defaults.
    max_tokens: int | None = Field(None, ge=1)
    system: str | None = None  # used when a request has no system or developer message
    chat_template: str | None = None  # Jinja text, or a file (relative: to $MLXD_HOME)
    aliases: list[str] = []  # other names a request's `model` may use
    # LoRA adapters (docs/configuration.md): this model's, mounted at its start (name ->
    # mlx-lm adapter folder; requests name them "<id>:<name>"), or, with `base`, this id is
    # `base` served with the adapter at `adapter_path` (one worker and one copy of the base
    # weights however many ids name it).
    adapters: dict[str, Path] = {}
    base: str | None = None
    adapter_path: Path | None = None
    adapter_cache_bytes: Bytes | None = Field(None, ge=0)  # loaded adapters' factors
    # Speculative decoding of a lone row: prompt lookup, or a small model of the same tokenizer
    # (`draft_model`: a configured model's id, or a folder; relative: under $MLXD_HOME/models).
    speculative: Literal["off", "ngram", "draft"] = "off"
    draft_model: str | None = None
    num_draft_tokens: int = Field(4, ge=1, le=16)
    # A worker group (docs/scale-out.md): this model's ranks joined by mx.distributed, one
    # slot. group_size: that many ranks on this host; hosts: one rank per address (rank 0 is
    # this host's); backend: how the ranks talk (ring over TCP, NCCL on CUDA).
    group_size: int | None = Field(None, ge=1, le=64)
    hosts: list[str] = Field([], max_length=64)
    backend: Literal["ring", "nccl"] = "ring"

    @field_validator("hosts")
    @classmethod
    def _host_addresses(cls, hosts: list[str]) -> list[str]:
        # The ring backend's hostfile needs addresses; each is also an ssh destination, so
        # never an option or a shell word. The ssh user comes from ~/.ssh/config.
        hosts = ["127.0.0.1" if h == "localhost" else h for h in hosts]
        for h in hosts:
            try:
                ipaddress.ip_address(h)
            except ValueError:
                raise ValueError(
                    f"{h!r} is not an IP address (the ring backend needs one)"
                ) from None
        return hosts

    @model_validator(mode="after")
    def _one_group_shape(self):
        if self.group_size is not None and self.hosts:
            raise ValueError("give group_size (ranks on this host) or hosts, not both")
        return self

    @model_validator(mode="after")
    def _speculation_that_can_run(self):
        if (why := speculation_conflict(self.speculative, self.kv_bits, self.ranks)) is not None:
            raise ValueError(why)
        return self

    @property
    def ranks(self) -> int:
        """How many processes serve this model: 1, or its worker group's size."""
        return len(self.hosts) or self.group_size or 1

    @property
    def local_ranks(self) -> int:
        """How many of those processes use this host's memory (remote ranks use their own)."""
        return self.group_size or 1


class ResolvedModelSettings(ModelSettings):
    """A model's section with the daemon-wide fallbacks filled in (`Settings.for_model`)."""

    keep_alive_s: float
    batch: int
    kv_allowance_bytes: int
