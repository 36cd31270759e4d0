"""Anthropic Messages API request bodies: /v1/messages and /v1/messages/count_tokens (the
answers, the message and its stream events, are in anthropic_answers.py)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from mlxd.shared.chat_job import (
    IMAGE_PART,
    ChatJob,
    ToolMode,
    function_tool,
    part_text,
    text_of,
    tool_call_message,
)
from mlxd.shared.errors import BadRequest
from mlxd.shared.images import ImageInput, check_media_type, decode_base64, image_input
from mlxd.shared.params import (
    MAX_STOP_SEQUENCES,
    GenerationParams,
    check_stop_strings,
    effort_of,
)
from mlxd.shared.sampling import SamplingFields, sampling_of
from mlxd.shared.structured_output import GuidedFields, GuidedSpec
from mlxd.shared.wire.bodies import Lenient


class AnthropicTool(Lenient):
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    type: str | None = None

    @field_validator("type")
    @classmethod
    def _custom_only(cls, v):
        if v not in (None, "custom"):
            raise ValueError(f"server tools such as {v!r} are not supported")
        return v


class ToolChoice(Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


# Anthropic's own bounds on an extended-thinking budget (its API answers 400 outside them).
MIN_THINKING_BUDGET = 1024
THINKING_TYPES = ("enabled", "disabled", "adaptive")


class MessageParam(Lenient):
    # "system" mid-conversation: Claude Code's beta `mid-conversation-system-2026-04-07`.
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class MessagesRequest(GuidedFields, SamplingFields):
    """POST /v1/messages (and, without max_tokens, /v1/messages/count_tokens).

    The vLLM-style `guided_*` fields are an mlxd extension (Anthropic has no equivalent).
    """

    model: str | None = None
    max_tokens: int = Field(ge=1)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_SEQUENCES)
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0)  # Anthropic's bound
    metadata: dict[str, Any] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None  # {"format": {"type": "json_schema", ...}}
    output_format: dict[str, Any] | None = None  # the same, under its beta name
    # count_tokens has no max_tokens to hold the budget under
    _budget_below_max: ClassVar[bool] = True

    @field_validator("stop_sequences")
    @classmethod
    def _no_empty_stop(cls, v):
        check_stop_strings(v or [])
        return v

    def to_generation_params(self) -> GenerationParams:
        return GenerationParams(
            max_tokens=self.max_tokens,
            **sampling_of(self),
            stop=tuple(self.stop_sequences or ()),
            reasoning_budget=self._thinking_budget(),
            reasoning_effort=effort_of(
                (self.output_config or {}).get("effort"), "output_config.effort"
            ),
        )

    def _thinking_budget(self) -> int | None:
        """`thinking.budget_tokens`, checked as Anthropic checks it: at least 1024 and below
        max_tokens (the thinking and the answer share max_tokens)."""
        thinking = self.thinking or {}
        kind = thinking.get("type")
        if self.thinking is not None and kind not in THINKING_TYPES:
            raise BadRequest(
                f"thinking.type: Input should be {', '.join(map(repr, THINKING_TYPES))}",
                param="thinking.type",
            )
        if kind != "enabled":
            return None
        budget = thinking.get("budget_tokens")
        param = "thinking.enabled.budget_tokens"
        if type(budget) is not int:
            raise BadRequest(f"{param}: Input should be a valid integer", param=param)
        if budget < MIN_THINKING_BUDGET:
            raise BadRequest(
                f"{param}: Input should be greater than or equal to {MIN_THINKING_BUDGET}",
                param=param,
            )
        if self._budget_below_max and budget >= self.max_tokens:
            raise BadRequest(
                "`max_tokens` must be greater than `thinking.budget_tokens`", param="max_tokens"
            )
        return budget

    def to_chat_job(self) -> ChatJob:
        """The worker's view of this request."""
        tools = [function_tool(t.name, t.description, t.input_schema) for t in self.tools or []]
        mode, forced = self._tool_mode(tools)
        kwargs: dict[str, Any] = {}
        if self.thinking and self.thinking.get("type") in ("enabled", "disabled"):
            kwargs["enable_thinking"] = self.thinking["type"] == "enabled"
        user = (self.metadata or {}).get("user_id")
        images: list[ImageInput] = []
        return ChatJob(
            messages=self.chat_messages(images),
            images=images,
            params=self.to_generation_params(),
            tools=tools or None,
            tool_mode=mode,
            forced_tool=forced,
            template_kwargs=kwargs,
            guided=self._output_spec() or self.to_guided_spec(),
            session=user if isinstance(user, str) else None,
            report_stop=True,
            surface="anthropic",
        )

    def _output_spec(self) -> GuidedSpec | None:
        fmt = (self.output_config or {}).get("format") or self.output_format
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
            return None
        param = "output_config.format" if self.output_config else "output_format"
        return GuidedSpec("json_schema", fmt.get("schema") or {"type": "object"}, param)

    def _tool_mode(self, tools: list[dict]) -> tuple[ToolMode, str | None]:
        choice = self.tool_choice
        if choice is None or choice.type == "auto":
            return "auto", None
        if choice.type == "none":
            return "none", None
        if choice.type == "any":
            return "required", None
        if choice.name not in {t["function"]["name"] for t in tools}:
            raise BadRequest(
                f"tool_choice.name: no tool named {choice.name!r}", param="tool_choice.name"
            )
        return "function", choice.name

    def chat_messages(self, images: list[ImageInput] | None = None) -> list[dict[str, Any]]:
        """The conversation in the chat-template shape (OpenAI roles and tool messages); the
        user messages' images are appended to `images` in order."""
        images = [] if images is None else images
        out: list[dict[str, Any]] = []
        if self.system:
            out.append({"role": "system", "content": text_of(self.system, "system", sep="\n\n")})
        for i, msg in enumerate(self.messages):
            if msg.role == "system":  # kept in place; the worker folds it if need be
                out.append(
                    {"role": "system", "content": text_of(msg.content, f"messages.{i}.content")}
                )
            elif isinstance(msg.content, str):
                out.append({"role": msg.role, "content": msg.content})
            elif msg.role == "user":
                out.extend(_user_blocks(msg.content, f"messages.{i}.content", images))
            else:
                out.append(_assistant_blocks(msg.content, f"messages.{i}.content"))
        return out


def _user_blocks(blocks: list[dict], param: str, images: list[ImageInput]) -> list[dict]:
    """Tool results become tool messages (first, as templates expect), then the text and
    images: one string when there is no image, else parts in order. A tool result's images
    (a screenshot, an image file read) join that user turn, in order: templates render a tool
    message as text."""
    tools: list[dict] = []
    parts: list[dict] = []
    for j, b in enumerate(blocks):
        kind = b.get("type")
        if kind == "tool_result":
            content, where = b.get("content"), f"{param}.{j}.content"
            if isinstance(content, list):
                for k, c in enumerate(content):
                    if isinstance(c, dict) and c.get("type") == "image":
                        images.append(_image_block(c, f"{where}.{k}"))
                        parts.append(dict(IMAGE_PART))
                content = [
                    c for c in content if not (isinstance(c, dict) and c.get("type") == "image")
                ]
            text = text_of(content, where)
            if b.get("is_error"):
                text = f"Error: {text}"
            tools.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": text})
        elif kind == "text":
            parts.append({"type": "text", "text": part_text(b, f"{param}.{j}")})
        elif kind == "image":
            images.append(_image_block(b, f"{param}.{j}"))
            parts.append(dict(IMAGE_PART))
        else:
            raise BadRequest(
                f"Invalid '{param}.{j}': content blocks of type {kind!r} are not supported",
                param=f"{param}.{j}",
            )
    if not parts and tools:
        return tools
    if all(p["type"] == "text" for p in parts):
        return [*tools, {"role": "user", "content": "".join(p["text"] for p in parts)}]
    return [*tools, {"role": "user", "content": parts}]


def _image_block(block: dict, param: str) -> ImageInput:
    """An `image` block's source: base64 data of a named type, or a URL."""
    source = block.get("source")
    source = source if isinstance(source, dict) else {}
    kind, param = source.get("type"), f"{param}.source"
    if kind == "base64":
        media_type, data = source.get("media_type"), source.get("data")
        check_media_type(media_type if isinstance(media_type, str) else "(none)", param)
        if not isinstance(data, str):
            raise BadRequest(f"Invalid '{param}.data': base64 text is required", param=param)
        return ImageInput(decode_base64(data, f"{param}.data"), None, f"{param}.data")
    if kind == "url":
        return image_input(source.get("url"), f"{param}.url")
    if kind == "file":
        raise BadRequest(
            f"Invalid '{param}': file ids are not supported: send the image as base64 data",
            param=param,
        )
    raise BadRequest(f"Invalid '{param}': give a base64 or url source", param=param)


def _assistant_blocks(blocks: list[dict], param: str) -> dict:
    msg: dict[str, Any] = {"role": "assistant", "content": ""}
    for j, b in enumerate(blocks):
        kind = b.get("type")
        if kind == "text":
            msg["content"] += part_text(b, f"{param}.{j}")
        elif kind == "thinking":
            msg["reasoning_content"] = str(b.get("thinking", ""))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            msg.setdefault("tool_calls", []).append(
                tool_call_message(b.get("id"), b.get("name"), b.get("input") or {})
            )
        elif kind == "image":
            raise BadRequest(
                f"Invalid '{param}.{j}': images are accepted in user messages only",
                param=f"{param}.{j}",
            )
        else:
            raise BadRequest(
                f"Invalid '{param}.{j}': content blocks of type {kind!r} are not supported",
                param=f"{param}.{j}",
            )
    return msg


class CountTokensRequest(MessagesRequest):
    max_tokens: int = Field(1, ge=1)
    _budget_below_max: ClassVar[bool] = False
