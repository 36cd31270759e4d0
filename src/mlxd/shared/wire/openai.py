"""OpenAI chat-completions request bodies; the response bodies and model list are in openai_out.py.

The legacy /v1/completions bodies are in completions.py; both share `SamplingRequest`.

Requests validate strictly (wrong types and out-of-range values are a 400 naming the field)
but ignore unknown fields, as clients send many vendor extensions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from mlxd.shared.chat_job import (
    ChatJob,
    arguments_object,
    content_parts,
    developer_as_system,
    text_of,
    tool_mode,
    with_effort,
)
from mlxd.shared.errors import BadRequest
from mlxd.shared.images import ImageInput, image_input
from mlxd.shared.params import (
    MAX_SEED,
    MAX_STOP_SEQUENCES,
    MIN_SEED,
    Effort,
    GenerationParams,
    check_stop_strings,
)
from mlxd.shared.sampling import SamplingFields, sampling_of
from mlxd.shared.structured_output import GuidedFields
from mlxd.shared.wire.bodies import Lenient
from mlxd.shared.wire.tools import CUSTOM_INPUT, chat_tool_set


class StreamOptions(Lenient):
    include_usage: bool = False


class ChatMessage(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def to_template(self, i: int, images: list[ImageInput]) -> dict[str, Any]:
        """This message as chat templates expect it: text content (a user message's images as
        parts, each appended to `images`), tool-call arguments as objects (a JSON string
        would be quoted twice by `| tojson`)."""
        out = self.model_dump(exclude_none=True)
        if out["role"] == "developer":  # OpenAI's newer name; templates know "system"
            out = developer_as_system(out)
        param = f"messages.{i}.content"
        if self.role == "user":
            out["content"] = content_parts(self.content, param, images, image_url_part)
        else:
            out["content"] = text_of(self.content, param)
        for j, call in enumerate(out.get("tool_calls") or []):
            custom = call.get("custom") if call.get("type") == "custom" else None
            if isinstance(custom, dict):  # a custom tool's call: its function shape here
                call = out["tool_calls"][j] = {
                    "id": call.get("id"),
                    "type": "function",
                    "function": {
                        "name": custom.get("name"),
                        "arguments": {CUSTOM_INPUT: custom.get("input", "")},
                    },
                }
            fn = call.get("function")
            if not isinstance(fn, dict):
                where = f"messages.{i}.tool_calls.{j}.function"
                raise BadRequest(f"Invalid '{where}': expected an object", param=where)
            if "arguments" in fn:
                fn["arguments"] = arguments_object(fn["arguments"])
        return out


def image_url_part(part: dict[str, Any], param: str) -> ImageInput | None:
    """An `image_url` part's image (`detail` is accepted and ignored); None for other parts."""
    if part.get("type") != "image_url":
        return None
    value = part.get("image_url")
    url = value.get("url") if isinstance(value, dict) else value  # some clients send the string
    return image_input(url, f"{param}.image_url")


class SamplingRequest(Lenient, SamplingFields):
    """Fields shared by chat and completions."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=MIN_SEED, le=MAX_SEED)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    stop: str | list[str] | None = None
    n: int | None = Field(None, ge=1, le=1)
    user: str | None = None
    speculative: bool | None = None  # mlxd: false opts this request out of speculative decoding

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        check_stop_strings(stops)
        return v

    @field_validator("logit_bias")
    @classmethod
    def _check_bias(cls, v):
        for k, bias in (v or {}).items():
            # ASCII digits only: str.isdigit() also passes "²", which int() refuses.
            if not (k.isascii() and k.isdigit()) or len(k) > 20:
                raise ValueError(f"logit_bias key {k[:32]!r} is not a token id")
            if not -100.0 <= bias <= 100.0:
                raise ValueError("logit_bias values must be within [-100, 100]")
        return v

    def _limit(self) -> int | None:
        return self.max_tokens

    def _logprobs(self) -> tuple[bool, int]:
        return False, 0

    def to_generation_params(self) -> GenerationParams:
        """The engine's view of this request."""
        want_logprobs, top = self._logprobs()
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return GenerationParams(
            max_tokens=self._limit(),
            **sampling_of(self),
            seed=self.seed,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias={int(k): v for k, v in (self.logit_bias or {}).items()},
            stop=stop,
            logprobs=want_logprobs,
            top_logprobs=top,
            speculative=self.speculative,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


# Arguments of the tokenizer's apply_chat_template that the worker itself passes or that
# change what it returns: a client's chat_template_kwargs may not set them.
SERVER_TEMPLATE_ARGS = frozenset(
    {"conversation", "add_generation_prompt", "tokenize", "return_dict", "return_tensors"}
)


class ChatCompletionRequest(SamplingRequest, GuidedFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    prompt_cache_key: str | None = None
    reasoning_effort: Effort | None = None
    thinking_token_budget: int | None = Field(None, ge=0)  # vLLM's name: a budget in tokens

    @field_validator("chat_template_kwargs")
    @classmethod
    def _own_keys(cls, v):
        if v and "chat_template" in v:
            # A template is code the worker runs: a request's own could loop for hours (the
            # sandbox bounds one range, not nested ones). Operators set one per model.
            raise ValueError(
                "chat_template: a request may not replace the model's chat template "
                "(an operator sets one per model: chat_template in config.toml)"
            )
        taken = sorted(set(v or ()) & SERVER_TEMPLATE_ARGS)
        if taken:
            raise ValueError(f"{', '.join(taken)}: set by the server, not a template variable")
        return v

    @model_validator(mode="after")
    def _check_logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs: true")
        return self

    def _limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def _logprobs(self) -> tuple[bool, int]:
        return bool(self.logprobs), self.top_logprobs or 0

    def to_generation_params(self) -> GenerationParams:
        return replace(
            super().to_generation_params(),
            reasoning_budget=self.thinking_token_budget,
            reasoning_effort=self.reasoning_effort,
        )

    def template_messages(self, images: list[ImageInput]) -> list[dict[str, Any]]:
        """Messages as plain dicts for the chat template (unset fields left out); their
        images are appended to `images` in order."""
        return [m.to_template(i, images) for i, m in enumerate(self.messages)]

    def to_chat_job(self) -> ChatJob:
        """The worker's view of this request."""
        tool_set = chat_tool_set(self.tools)
        tools = tool_set.tools or None
        mode, forced = tool_mode(self.tool_choice, tools)
        images: list[ImageInput] = []
        return ChatJob(
            messages=self.template_messages(images),
            images=images,
            params=self.to_generation_params(),
            tools=tools,
            tool_mode=mode,
            forced_tool=forced,
            template_kwargs=with_effort(self.chat_template_kwargs, self.reasoning_effort),
            guided=self.to_guided_spec(),
            session=self.prompt_cache_key,
            tool_origins=tool_set.origins,
            warnings=[tool_set.warning] if tool_set.warning else [],
        )
