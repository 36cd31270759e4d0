"""Ollama API request bodies: /api/chat, /api/generate, /api/show and the embeddings routes
(the answers are in ollama_answers.py).

Requests convert themselves into a `ChatJob` (`to_chat_job()`), so Ollama clients run on the
one chat driver like every other surface. Fields Ollama defines that mlxd cannot honour are a
400 saying so; options that only place or size llama.cpp's work (num_gpu, num_thread, ...)
change nothing a client can see here and are accepted and ignored, as are unknown options.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

from pydantic import Field, field_validator

from mlxd.shared.chat_job import (
    IMAGE_PART,
    ChatJob,
    RawPrompt,
    developer_as_system,
    tool_call_message,
)
from mlxd.shared.errors import BadRequest
from mlxd.shared.images import ImageInput, decode_base64, decode_data_url
from mlxd.shared.params import (
    GenerationParams,
)
from mlxd.shared.structured_output import GuidedFields, GuidedSpec
from mlxd.shared.wire.bodies import Lenient
from mlxd.shared.wire.keep_alive import check_keep_alive, keep_alive_seconds
from mlxd.shared.wire.ollama_options import Options
from mlxd.shared.wire.tools import chat_tool_set

LATEST = ":latest"


def image_parts(
    images: list[str] | None, text: str, param: str, into: list[ImageInput]
) -> str | list[dict[str, Any]]:
    """A message's content with its `images` (base64, as Ollama sends them): the images first,
    then the text, as Ollama's own runner renders them; the text alone when there are none.
    Each image is appended to `into`."""
    if not images:
        return text
    for k, data in enumerate(images):
        where = f"{param}.{k}"
        # Ollama sends bare base64; a data: URL is taken too (some clients send one).
        is_url = data[:5].lower() == "data:"
        decoded = decode_data_url(data, where) if is_url else decode_base64(data, where)
        into.append(ImageInput(decoded, None, where))
    parts: list[dict[str, Any]] = [dict(IMAGE_PART) for _ in images]
    return [*parts, {"type": "text", "text": text}] if text else parts


def model_id_of(name: str) -> str:
    """The mlxd id an Ollama model name means: "smollm2:latest" is the model "smollm2"."""
    return name.removesuffix(LATEST) if name.endswith(LATEST) else name


class _Generating(GuidedFields):
    """What /api/chat and /api/generate share. The vLLM-style `guided_*` fields are an mlxd
    extension, as on the other surfaces; `format` is Ollama's own."""

    model: str = Field(min_length=1)
    stream: bool = True
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: Options | None = None
    keep_alive: float | int | str | None = None
    think: bool | Literal["high", "medium", "low"] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    _duration = field_validator("keep_alive")(check_keep_alive)

    @property
    def keep_alive_s(self) -> float | None:
        return keep_alive_seconds(self.keep_alive)

    def generation_params(self) -> GenerationParams:
        if self.top_logprobs and not self.logprobs:
            raise BadRequest("top_logprobs requires logprobs: true", param="top_logprobs")
        lp = {"logprobs": bool(self.logprobs), "top_logprobs": self.top_logprobs or 0}
        params = (self.options or Options()).to_generation_params(**lp)
        # A level is a reasoning effort (EFFORT_BUDGETS); `true` thinks without a budget.
        effort = self.think if isinstance(self.think, str) else None
        return replace(params, reasoning_effort=effort)

    def guided(self) -> GuidedSpec | None:
        """`format` ("json" or a JSON schema) or one of the guided fields, never both."""
        other = self.to_guided_spec()
        if self.format in (None, ""):
            return other
        if other is not None:
            raise BadRequest(f"format and {other.param} cannot both be set", param="format")
        if self.format == "json":
            return GuidedSpec("json_object", None, "format")
        return GuidedSpec("json_schema", self.format, "format")

    def template_kwargs(self) -> dict[str, Any]:
        if self.think is None:
            return {}
        if isinstance(self.think, str):  # gpt-oss style levels
            return {"enable_thinking": True, "reasoning_effort": self.think}
        return {"enable_thinking": self.think}


class ToolCallFunction(Lenient):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCallIn(Lenient):
    function: ToolCallFunction
    id: str | None = None


class ChatMessage(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_name: str | None = None

    def to_template(self, i: int, images: list[ImageInput]) -> dict[str, Any]:
        """This message as chat templates expect it; its images are appended to `images`."""
        param = f"messages.{i}.images"
        if self.images and self.role != "user":
            raise BadRequest(
                f"Invalid '{param}': images are accepted in user messages only", param=param
            )
        content = image_parts(self.images, self.content, param, images)
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.thinking:
            out["reasoning_content"] = self.thinking
        if self.tool_calls:
            out["tool_calls"] = [
                tool_call_message(c.id, c.function.name, c.function.arguments)
                for c in self.tool_calls
            ]
        if self.tool_name:
            out["name"] = self.tool_name
        return developer_as_system(out) if self.role == "developer" else out


class ChatRequest(_Generating):
    """POST /api/chat. No messages at all: Ollama's "load the model" (or, with keep_alive 0,
    "unload it") request, which the supervisor answers itself."""

    messages: list[ChatMessage] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None

    @property
    def empty(self) -> bool:
        return not self.messages

    def to_chat_job(self) -> ChatJob:
        """The worker's view of this request."""
        tool_set = chat_tool_set(self.tools)
        images: list[ImageInput] = []
        return ChatJob(
            messages=[m.to_template(i, images) for i, m in enumerate(self.messages)],
            images=images,
            params=self.generation_params(),
            tools=tool_set.tools or None,
            template_kwargs=self.template_kwargs(),
            guided=self.guided(),
            tool_origins=tool_set.origins,
            warnings=[tool_set.warning] if tool_set.warning else [],
        )


class GenerateRequest(_Generating):
    """POST /api/generate: a prompt through the chat template (`raw`: as it is). No prompt:
    Ollama's load (or unload) request, answered by the supervisor."""

    prompt: str | None = None
    system: str | None = None
    raw: bool = False
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None
    images: list[str] | None = None

    @field_validator("suffix", "template")
    @classmethod
    def _unsupported(cls, v, info):
        if v:
            why = {"suffix": "fill-in-the-middle", "template": "per-request templates"}
            raise ValueError(f"{why[info.field_name]} is not supported; leave it unset")
        return v

    @field_validator("context")
    @classmethod
    def _no_context(cls, v):
        if v:
            raise ValueError("the deprecated 'context' is not supported; send /api/chat messages")
        return v

    @property
    def empty(self) -> bool:
        return not self.prompt

    def to_chat_job(self) -> ChatJob:
        """The worker's view of this request."""
        params = self.generation_params()
        if self.raw:
            if self.images:  # a raw prompt goes to the tokenizer as it is: no place for them
                raise BadRequest("Invalid 'images': a raw prompt takes no images", param="images")
            raw = RawPrompt(self.prompt or "")
            return ChatJob(messages=[], params=params, guided=self.guided(), raw=raw)
        system = [{"role": "system", "content": self.system}] if self.system else []
        images: list[ImageInput] = []
        content = image_parts(self.images, self.prompt or "", "images", images)
        return ChatJob(
            messages=[*system, {"role": "user", "content": content}],
            images=images,
            params=params,
            template_kwargs=self.template_kwargs(),
            guided=self.guided(),
        )


class ModelRequest(Lenient):
    """POST /api/show (older clients send `name`)."""

    model: str | None = None
    name: str | None = None
    verbose: bool = False

    @property
    def model_name(self) -> str:
        if not (self.model or self.name):
            raise BadRequest("Invalid 'model': a model name is required", param="model")
        return self.model or self.name or ""


class EmbedRequest(Lenient):
    """POST /api/embed (`input`) and the older /api/embeddings (`prompt`)."""

    model: str = Field(min_length=1)
    input: str | list[str] | None = None
    prompt: str | None = None
    truncate: bool = True
    dimensions: int | None = Field(None, ge=1)
    options: dict[str, Any] | None = None
    keep_alive: float | int | str | None = None

    _duration = field_validator("keep_alive")(check_keep_alive)

    @property
    def keep_alive_s(self) -> float | None:
        return keep_alive_seconds(self.keep_alive)

    def texts(self) -> list[str]:
        value = self.input if self.input is not None else self.prompt
        if isinstance(value, str):  # "" alone is Ollama's way to load the model
            return [value] if value else []
        return list(value or [])
