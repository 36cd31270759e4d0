"""Anthropic Messages API wire bodies: requests, the message, and the stream events."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mlxd.shared.chat_job import ChatJob, ToolMode, function_tool, text_of, tool_call_message
from mlxd.shared.errors import BadRequest
from mlxd.shared.params import MAX_STOP_CHARS, GenerationParams
from mlxd.shared.structured_output import GuidedFields, GuidedSpec

MAX_STOP_SEQUENCES = 16
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "error": "end_turn",
}


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class AnthropicTool(_Lenient):
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


class ToolChoice(_Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class MessageParam(_Lenient):
    # "system" mid-conversation: Claude Code's beta `mid-conversation-system-2026-04-07`.
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class MessagesRequest(GuidedFields):
    """POST /v1/messages (and, without max_tokens, /v1/messages/count_tokens).

    The vLLM-style `guided_*` fields are an mlxd extension (Anthropic has no equivalent).
    """

    model: str | None = None
    max_tokens: int = Field(ge=1)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_SEQUENCES)
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    metadata: dict[str, Any] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None  # {"format": {"type": "json_schema", ...}}
    output_format: dict[str, Any] | None = None  # the same, under its beta name

    @field_validator("stop_sequences")
    @classmethod
    def _no_empty_stop(cls, v):
        if any(s == "" for s in v or []):
            raise ValueError("stop sequences must not be empty")
        if any(len(s) > MAX_STOP_CHARS for s in v or []):
            raise ValueError(f"stop sequences must be at most {MAX_STOP_CHARS} characters")
        return v

    def to_generation_params(self) -> GenerationParams:
        return GenerationParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=tuple(self.stop_sequences or ()),
        )

    def to_chat_job(self) -> ChatJob:
        """The worker's view of this request."""
        tools = [function_tool(t.name, t.description, t.input_schema) for t in self.tools or []]
        mode, forced = self._tool_mode(tools)
        kwargs: dict[str, Any] = {}
        if self.thinking and self.thinking.get("type") in ("enabled", "disabled"):
            kwargs["enable_thinking"] = self.thinking["type"] == "enabled"
        user = (self.metadata or {}).get("user_id")
        return ChatJob(
            messages=self.chat_messages(),
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

    def chat_messages(self) -> list[dict[str, Any]]:
        """The conversation in the chat-template shape (OpenAI roles and tool messages)."""
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
                out.extend(_user_blocks(msg.content, f"messages.{i}.content"))
            else:
                out.append(_assistant_blocks(msg.content, f"messages.{i}.content"))
        return out


def _user_blocks(blocks: list[dict], param: str) -> list[dict]:
    """Tool results become tool messages (first, as templates expect), then the text."""
    tools, texts = [], []
    for j, b in enumerate(blocks):
        kind = b.get("type")
        if kind == "tool_result":
            content = text_of(b.get("content"), f"{param}.{j}.content")
            if b.get("is_error"):
                content = f"Error: {content}"
            tools.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": content})
        elif kind == "text":
            texts.append(str(b.get("text", "")))
        else:
            raise BadRequest(
                f"Invalid '{param}.{j}': content blocks of type {kind!r} are not supported",
                param=f"{param}.{j}",
            )
    return tools + ([{"role": "user", "content": "".join(texts)}] if texts or not tools else [])


def _assistant_blocks(blocks: list[dict], param: str) -> dict:
    msg: dict[str, Any] = {"role": "assistant", "content": ""}
    for j, b in enumerate(blocks):
        kind = b.get("type")
        if kind == "text":
            msg["content"] += str(b.get("text", ""))
        elif kind == "thinking":
            msg["reasoning_content"] = str(b.get("thinking", ""))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            msg.setdefault("tool_calls", []).append(
                tool_call_message(b.get("id"), b.get("name"), b.get("input") or {})
            )
        else:
            raise BadRequest(
                f"Invalid '{param}.{j}': content blocks of type {kind!r} are not supported",
                param=f"{param}.{j}",
            )
    return msg


class CountTokensRequest(MessagesRequest):
    max_tokens: int = Field(1, ge=1)


class CountTokens(BaseModel):
    input_tokens: int


# -- responses ---------------------------------------------------------------------------
class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingBlock(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


Block = TextBlock | ThinkingBlock | ToolUseBlock


class AnthropicUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class Message(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[Block]
    stop_reason: str | None = None
    stop_sequence: str | None = None
    usage: AnthropicUsage


class _Event(BaseModel):
    type: str


class MessageStart(_Event):
    type: Literal["message_start"] = "message_start"
    message: Message


class BlockStart(_Event):
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: Block


class TextDelta(BaseModel):
    type: Literal["text_delta"] = "text_delta"
    text: str


class ThinkingDelta(BaseModel):
    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str


class InputJsonDelta(BaseModel):
    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


class BlockDelta(_Event):
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: TextDelta | ThinkingDelta | InputJsonDelta


class BlockStop(_Event):
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class MessageDeltaBody(BaseModel):
    stop_reason: str | None
    stop_sequence: str | None = None


class MessageDelta(_Event):
    type: Literal["message_delta"] = "message_delta"
    delta: MessageDeltaBody
    usage: dict[str, int]


class MessageStop(_Event):
    type: Literal["message_stop"] = "message_stop"


class Ping(_Event):
    type: Literal["ping"] = "ping"


def stop_reason(finish: str, stop_sequence: str | None) -> str:
    """The engine's finish reason in Anthropic's words."""
    return "stop_sequence" if stop_sequence is not None else STOP_REASONS.get(finish, "end_turn")
