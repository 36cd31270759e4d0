"""OpenAI Responses API request body (the response and its events: responses_out.py).

The worker is stateless: it answers `input` as given. The supervisor keeps the response store
and expands `previous_response_id` into the full input before forwarding (`expand_input`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mlxd.shared.chat_job import (
    ChatJob,
    content_parts,
    developer_as_system,
    part_text,
    text_of,
    tool_call_message,
    tool_mode,
    with_effort,
)
from mlxd.shared.errors import BadRequest
from mlxd.shared.images import ImageInput, image_input
from mlxd.shared.params import Effort, GenerationParams, effort_of
from mlxd.shared.sampling import SamplingFields, sampling_of
from mlxd.shared.structured_output import GuidedFields, GuidedSpec, JsonSchemaFormat
from mlxd.shared.wire.tools import CUSTOM_INPUT, ToolSet, qualified_name, responses_tool_set


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)


class TextFormat(JsonSchemaFormat):
    type: Literal["text", "json_object", "json_schema"] = "text"


class TextConfig(_Lenient):
    format: TextFormat | None = None


class ResponsesRequest(GuidedFields, SamplingFields):
    """POST /v1/responses (`guided_*` as in chat completions are an mlxd extension)."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    text: TextConfig | None = None
    metadata: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    reasoning: dict[str, Any] | None = None
    user: str | None = None

    def input_items(self) -> list[dict[str, Any]]:
        """`input` as a list of items (a string is one user message)."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return list(self.input)

    def tool_set(self) -> ToolSet:
        """`tools` as function tools (namespaces flattened, hosted tools left out)."""
        return responses_tool_set(self.tools)

    def to_generation_params(self) -> GenerationParams:
        # max_output_tokens holds reasoning and answer: the effort takes its share of it
        # (EFFORT_BUDGETS), the rest is the answer's.
        return GenerationParams(
            max_tokens=self.max_output_tokens,
            **sampling_of(self),
            reasoning_effort=self._effort(),
        )

    def _effort(self) -> Effort | None:
        return effort_of((self.reasoning or {}).get("effort"), "reasoning.effort")

    def to_guided_spec(self) -> GuidedSpec | None:
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type == "text":
            return super().to_guided_spec()
        if fmt.type == "json_object":
            return GuidedSpec("json_object", None, "text.format")
        return GuidedSpec("json_schema", fmt.schema_ or {"type": "object"}, "text.format")

    def to_chat_job(self) -> ChatJob:
        """The worker's view of this request."""
        tool_set = self.tool_set()
        tools = tool_set.tools or None
        choice = self.tool_choice
        if isinstance(choice, dict) and choice.get("type") in ("function", "custom"):
            name = choice.get("name")
            if isinstance(choice.get("namespace"), str) and isinstance(name, str):
                name = qualified_name(choice["namespace"], name)
            choice = {"function": {"name": name}}
        mode, forced = tool_mode(choice, tools)
        images: list[ImageInput] = []
        messages = self.chat_messages(images)
        if not messages:
            raise BadRequest(
                "Invalid 'input': nothing to answer (no input items and no instructions)",
                param="input",
            )
        return ChatJob(
            messages=messages,
            images=images,
            params=self.to_generation_params(),
            tools=tools,
            tool_mode=mode,
            forced_tool=forced,
            template_kwargs=with_effort(None, self._effort()),
            guided=self.to_guided_spec(),
            session=self.prompt_cache_key,
            tool_origins=tool_set.origins,
            warnings=[tool_set.warning] if tool_set.warning else [],
            surface="responses",
        )

    def chat_messages(self, images: list[ImageInput] | None = None) -> list[dict[str, Any]]:
        """Input items as chat-template messages; `instructions` become the system message.
        The user messages' images are appended to `images` in order."""
        images = [] if images is None else images
        out: list[dict[str, Any]] = []
        if self.instructions:
            out.append({"role": "system", "content": self.instructions})
        reasoning = None
        for i, item in enumerate(self.input_items()):
            kind = item.get("type", "message")
            param = f"input.{i}"
            if kind == "message":
                given = item.get("role")
                role = "system" if given == "developer" else given
                if role not in ("system", "user", "assistant"):
                    raise BadRequest(f"Invalid '{param}.role'", param=f"{param}.role")
                content, where = item.get("content"), f"{param}.content"
                msg = {
                    "role": role,
                    "content": content_parts(content, where, images, input_image_part)
                    if role == "user"
                    else text_of(content, where),
                }
                if given == "developer":
                    msg = developer_as_system(msg)
                if role == "assistant" and reasoning:
                    msg["reasoning_content"], reasoning = reasoning, None
                out.append(msg)
            elif kind in ("function_call", "custom_tool_call"):
                name = item.get("name")
                if isinstance(item.get("namespace"), str) and isinstance(name, str):
                    name = qualified_name(item["namespace"], name)  # as the model saw it
                args = (
                    item.get("arguments", "{}")
                    if kind == "function_call"
                    else {CUSTOM_INPUT: item.get("input", "")}
                )
                call = tool_call_message(item.get("call_id"), name, args)
                if not (out and out[-1]["role"] == "assistant"):
                    out.append({"role": "assistant", "content": ""})
                if reasoning:  # the reasoning that led to this call (Codex sends it first)
                    out[-1]["reasoning_content"], reasoning = reasoning, None
                out[-1].setdefault("tool_calls", []).append(call)
            elif kind in ("function_call_output", "custom_tool_call_output"):
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": item.get("call_id"),
                        "content": text_of(item.get("output"), f"{param}.output"),
                    }
                )
            elif kind == "reasoning":
                reasoning = reasoning_text(item, param)
            else:
                raise BadRequest(
                    f"Invalid '{param}': items of type {kind!r} are not supported", param=param
                )
        return out


def reasoning_text(item: dict[str, Any], param: str) -> str:
    """A reasoning item's text: its `content` parts, then its `summary` parts (lists of
    objects with a `text`; either may be absent)."""
    texts: list[str] = []
    for field in ("content", "summary"):
        parts = item.get(field) or []
        where = f"{param}.{field}"
        if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
            raise BadRequest(f"Invalid '{where}': expected a list of objects", param=where)
        texts.extend(part_text(p, f"{where}.{i}") for i, p in enumerate(parts))
    return "".join(texts)


def input_image_part(part: dict[str, Any], param: str) -> ImageInput | None:
    """An `input_image` part's image (`detail` is accepted and ignored); None for others."""
    if part.get("type") != "input_image":
        return None
    if part.get("file_id") is not None and part.get("image_url") is None:
        raise BadRequest(
            f"Invalid '{param}.file_id': file ids are not supported: send the image as "
            "image_url, a data: URL (base64) or an http(s) URL",
            param=f"{param}.file_id",
        )
    return image_input(part.get("image_url"), f"{param}.image_url")
