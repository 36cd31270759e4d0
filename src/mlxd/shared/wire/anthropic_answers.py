"""Anthropic Messages API answers: the message, its content blocks, the stream events, and
the token count (the requests are in anthropic.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "error": "end_turn",
}


class CountTokens(BaseModel):
    input_tokens: int


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
