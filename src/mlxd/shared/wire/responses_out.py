"""OpenAI Responses API output: the response object, its items and its stream events. The
request body is in responses.py."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

if TYPE_CHECKING:
    from mlxd.shared.wire.responses import ResponsesRequest


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list = []
    logprobs: list = []


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class MessageItem(BaseModel):
    type: Literal["message"] = "message"
    id: str
    status: str = "completed"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = []


class FunctionCallItem(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: str = "completed"
    namespace: str | None = None  # a tool from a `namespace` entry (Codex routes by it)

    @model_serializer(mode="wrap")
    def _no_empty_namespace(self, handler):
        out = handler(self)
        if out.get("namespace") is None:
            out.pop("namespace", None)
        return out


class CustomToolCallItem(BaseModel):
    """A call to a freeform (`custom`) tool: its input is text, not JSON arguments."""

    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str
    call_id: str
    name: str
    input: str
    status: str = "completed"


class ReasoningItem(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list = []
    content: list[ReasoningText] = []


OutputItem = MessageItem | FunctionCallItem | CustomToolCallItem | ReasoningItem


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int

    @classmethod
    def of(cls, prompt: int, output: int, cached: int = 0) -> ResponseUsage:
        return cls(
            input_tokens=prompt,
            input_tokens_details={"cached_tokens": cached},
            output_tokens=output,
            output_tokens_details={"reasoning_tokens": 0},
            total_tokens=prompt + output,
        )


class Response(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    status: Literal["in_progress", "completed", "incomplete", "failed"] = "in_progress"
    model: str
    output: list[OutputItem] = []
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, str] | None = None
    instructions: str | None = None
    tools: list[dict[str, Any]] = []
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    previous_response_id: str | None = None
    store: bool = True
    text: dict[str, Any] = {"format": {"type": "text"}}
    metadata: dict[str, Any] = {}
    reasoning: dict[str, Any] | None = None
    truncation: str = "disabled"
    usage: ResponseUsage | None = None

    @classmethod
    def start(cls, rid: str, model: str, req: ResponsesRequest) -> Response:
        """The in-progress response that echoes the request's settings."""
        return cls(
            id=rid,
            model=model,
            instructions=req.instructions,
            tools=req.tools or [],
            tool_choice=req.tool_choice or "auto",
            parallel_tool_calls=req.parallel_tool_calls is not False,
            temperature=req.temperature,
            top_p=req.top_p,
            max_output_tokens=req.max_output_tokens,
            previous_response_id=req.previous_response_id,
            store=req.store,
            text=req.text.model_dump(by_alias=True, exclude_none=True)
            if req.text and req.text.format
            else {"format": {"type": "text"}},
            metadata=req.metadata or {},
            reasoning=req.reasoning,
        )


class StreamEvent(BaseModel):
    """One Responses stream event; the fields besides `type` depend on it."""

    model_config = ConfigDict(extra="allow")
    type: str
    sequence_number: int
