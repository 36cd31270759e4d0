"""Ollama's `options`: the sampling options that map onto the engine, checked like OpenAI's;
llama.cpp's placement and sizing knobs are accepted and ignored (ollama.py says why)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from mlxd.shared.errors import BadRequest
from mlxd.shared.params import (
    MAX_PENALTY_WINDOW,
    MAX_SEED,
    MAX_STOP_SEQUENCES,
    GenerationParams,
    check_stop_strings,
)
from mlxd.shared.sampling import SamplingFields, sampling_of
from mlxd.shared.wire.bodies import Lenient

# Accepted only at these values: the sampler has no such stage.
NEUTRAL = {"mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0}


class Options(Lenient, SamplingFields):
    """`options`: the sampling options that map onto the engine, checked like OpenAI's."""

    seed: int | None = Field(None, le=MAX_SEED)  # negative: a random seed, as in Ollama
    num_predict: int | None = Field(None, ge=-2)  # -1 and -2: up to the context's end
    stop: list[str] | None = Field(None, max_length=MAX_STOP_SEQUENCES)
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    num_ctx: int | None = Field(None, ge=1)
    # Accepted only at their neutral values: the sampler has no such stage.
    mirostat: int | None = None
    tfs_z: float | None = None
    typical_p: float | None = None
    repeat_last_n: int | None = None

    @field_validator("num_predict")
    @classmethod
    def _not_zero(cls, v):
        if v == 0:
            raise ValueError("must be at least 1, or -1 for no limit")
        return v

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v):
        check_stop_strings(v or [])
        return v

    @field_validator("mirostat", "tfs_z", "typical_p")
    @classmethod
    def _neutral_only(cls, v, info):
        if v is not None and v != NEUTRAL[info.field_name]:
            raise ValueError(
                f"{info.field_name} sampling is not supported; leave it unset or at "
                f"{NEUTRAL[info.field_name]}"
            )
        return v

    def to_generation_params(self, **extra: Any) -> GenerationParams:
        last_n = self.repeat_last_n
        if last_n is not None and not -1 <= last_n <= MAX_PENALTY_WINDOW:
            raise BadRequest(
                f"Invalid 'options.repeat_last_n': between -1 and {MAX_PENALTY_WINDOW}",
                param="options.repeat_last_n",
            )
        n = self.num_predict
        return GenerationParams(
            max_tokens=n if n is not None and n > 0 else None,
            **sampling_of(self),
            seed=self.seed if self.seed is not None and self.seed >= 0 else None,
            repetition_penalty=self.repeat_penalty,
            # -1 is "the whole context" in Ollama: here the longest window there is.
            penalty_window=MAX_PENALTY_WINDOW if last_n == -1 else last_n,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            stop=tuple(self.stop or ()),
            context_window=self.num_ctx,
            **extra,
        )
