"""OpenAI legacy completions wire bodies: POST /v1/completions and its answer.

The request converts itself into a `ChatJob` carrying a `RawPrompt`, so a completion runs
through the same worker driver as every chat surface.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator

from mlxd.shared.chat_job import ChatJob, RawPrompt
from mlxd.shared.errors import BadRequest
from mlxd.shared.structured_output import GuidedFields
from mlxd.shared.wire.openai import SamplingRequest
from mlxd.shared.wire.openai_out import Usage


class CompletionRequest(SamplingRequest, GuidedFields):
    prompt: str | list[int] | list[str] = Field(...)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], str):
            if len(v) != 1:
                raise ValueError("only one prompt per request is supported")
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        return v

    def _logprobs(self) -> tuple[bool, int]:
        return self.logprobs is not None, self.logprobs or 0

    def to_chat_job(self) -> ChatJob:
        """The worker's view of this request: its prompt as given, no messages."""
        if self.echo and self.logprobs is not None:
            # OpenAI's lists then cover the echoed prompt too (its tokens' log-probabilities,
            # which the engine does not compute): refused rather than answered without them.
            raise BadRequest(
                "Invalid 'logprobs': prompt log-probabilities (echo with logprobs) are not "
                "supported; send echo or logprobs, not both",
                param="logprobs",
            )
        prompt = self.prompt
        if isinstance(prompt, list) and isinstance(prompt[0], str):  # one prompt, in a list
            prompt = prompt[0]
        return ChatJob(
            messages=[],
            params=self.to_generation_params(),
            guided=self.to_guided_spec(),
            raw=RawPrompt(prompt, echo=self.echo, suffix=self.suffix),
        )


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
