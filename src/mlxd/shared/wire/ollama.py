"""Ollama API request bodies: /api/chat, /api/generate, /api/show and the embeddings routes
(the answers are in ollama_answers.py).

Requests convert themselves into a `ChatJob` (`to_chat_job()`), so Ollama clients run on the
one chat driver like every other surface. Fields Ollama defines that mlxd cannot honour are a
400 saying so; options that only place or size llama.cpp's work (num_gpu, num_thread, ...)
change nothing a client can see here and are accepted and ignored, as are unknown options.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mlxd.shared.chat_job import ChatJob, RawPrompt, developer_as_system, tool_call_message
from mlxd.shared.errors import BadRequest
from mlxd.shared.params import MAX_PENALTY_WINDOW, MAX_SEED, MAX_STOP_CHARS, GenerationParams
from mlxd.shared.structured_output import GuidedFields, GuidedSpec
from mlxd.shared.wire.tools import chat_tool_set

LATEST = ":latest"
MAX_STOP_SEQUENCES = 16
NO_VISION = "images are not supported: mlxd serves text-only models (there is no vision yet)"
_DURATION = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)")
NEUTRAL = {"mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0}
MAX_KEEP_ALIVE_S = 292 * 365.25 * 86400
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _refuse_images(cls, v):
    """Images are refused (no vision yet), wherever a body can carry them."""
    if v:
        raise ValueError(NO_VISION)
    return v


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


def keep_alive_seconds(value: float | int | str | None) -> float | None:
    """Ollama's `keep_alive` in seconds: a number of seconds or a Go duration ("5m", "1h30m",
    "0"); negative keeps the model loaded for good (-1). None: the model's configured value."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        text = text.lstrip("+-")
        try:
            seconds = float(text)  # "300": plain seconds, which Ollama's Go parser refuses
        except ValueError:
            parts = _DURATION.findall(text)
            if not text or "".join(n + u for n, u in parts) != text:
                raise ValueError(
                    f"keep_alive {value[:40]!r} is not a duration such as '5m', '1h' or '0'"
                ) from None
            seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
        value = sign * seconds
    if math.isnan(value):
        raise ValueError("keep_alive must be a number of seconds or a duration")
    # Past ~292 years (Go's longest duration) it is "for good": a date that far is no date.
    return -1.0 if value < 0 or value > MAX_KEEP_ALIVE_S else float(value)


def check_keep_alive(cls, v):
    """A pydantic validator: a bad duration is a 400 before any model loads."""
    keep_alive_seconds(v)
    return v


def model_id_of(name: str) -> str:
    """The mlxd id an Ollama model name means: "smollm2:latest" is the model "smollm2"."""
    return name.removesuffix(LATEST) if name.endswith(LATEST) else name


class Options(_Lenient):
    """`options`: the sampling options that map onto the engine, checked like OpenAI's."""

    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
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
        if any(s == "" or len(s) > MAX_STOP_CHARS for s in v or []):
            raise ValueError(f"stop sequences must have 1 to {MAX_STOP_CHARS} characters")
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
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
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
        return (self.options or Options()).to_generation_params(**lp)

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


class ToolCallFunction(_Lenient):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCallIn(_Lenient):
    function: ToolCallFunction
    id: str | None = None


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None
    images: list[Any] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_name: str | None = None

    _no_images = field_validator("images")(_refuse_images)

    def to_template(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
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
        return ChatJob(
            messages=[m.to_template() for m in self.messages],
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
    images: list[Any] | None = None

    _no_images = field_validator("images")(_refuse_images)

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
            raw = RawPrompt(self.prompt or "")
            return ChatJob(messages=[], params=params, guided=self.guided(), raw=raw)
        system = [{"role": "system", "content": self.system}] if self.system else []
        return ChatJob(
            messages=[*system, {"role": "user", "content": self.prompt or ""}],
            params=params,
            template_kwargs=self.template_kwargs(),
            guided=self.guided(),
        )


class ModelRequest(_Lenient):
    """POST /api/show (older clients send `name`)."""

    model: str | None = None
    name: str | None = None
    verbose: bool = False

    @property
    def model_name(self) -> str:
        if not (self.model or self.name):
            raise BadRequest("Invalid 'model': a model name is required", param="model")
        return self.model or self.name or ""


class EmbedRequest(_Lenient):
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
