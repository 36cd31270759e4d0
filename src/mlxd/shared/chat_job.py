"""One chat-shaped generation, whatever API surface asked for it.

OpenAI chat, Anthropic Messages and the Responses API each convert their request into a
`ChatJob` (`to_chat_job()`): messages as the chat template expects them, tools in OpenAI's
function shape, the tool choice, template switches, sampling parameters and a structured-output
constraint. Legacy completions convert into one too, carrying a `RawPrompt` instead of
messages. The worker runs every job through one driver (worker/api/driver.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from mlxd.shared.errors import BadRequest
from mlxd.shared.params import GenerationParams
from mlxd.shared.structured_output import GuidedSpec
from mlxd.shared.wire.tools import ToolOrigin

ToolMode = Literal["auto", "none", "required", "function"]
Surface = Literal["openai", "anthropic", "responses"]


@dataclass
class RawPrompt:
    """A /v1/completions prompt: no chat template, no reasoning or tool-call parsing."""

    value: str | list[int]  # text, tokenized as it is, or token ids
    echo: bool = False  # the answer starts with the prompt's text
    suffix: str | None = None  # fill-in-the-middle, which this server does not do (a Warning)


@dataclass
class ChatJob:
    """What to render and how to sample; `forced_tool` names the tool when mode is function."""

    messages: list[dict[str, Any]]
    params: GenerationParams
    tools: list[dict[str, Any]] | None = None
    tool_mode: ToolMode = "auto"
    forced_tool: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    guided: GuidedSpec | None = None
    session: str | None = None  # prompt-cache affinity (prompt_cache_key, metadata.user_id)
    report_stop: bool = False  # the API names the stop string that matched (Anthropic)
    # Tools the model sees under another shape or name (namespaced, custom): see wire_tools.
    tool_origins: dict[str, ToolOrigin] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # `Warning` values for the response
    surface: Surface = "openai"  # whose wording errors use (the context-limit message)
    raw: RawPrompt | None = None  # a completion of this prompt instead of `messages`
    adapter: str | None = None  # a mounted LoRA adapter's name (the supervisor resolved it)

    @property
    def rendered_tools(self) -> list[dict[str, Any]] | None:
        """Tools as the template sees them: none at all when the client said "none"."""
        return self.tools if self.tools and self.tool_mode != "none" else None


def function_tool(name: str, description: str | None, parameters: dict | None) -> dict:
    """A tool in the OpenAI function shape that chat templates understand."""
    fn: dict[str, Any] = {"name": name}
    if description:
        fn["description"] = description
    fn["parameters"] = parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def with_effort(kwargs: dict[str, Any] | None, effort: str | None) -> dict[str, Any]:
    """Template kwargs with the reasoning effort for templates that read it (gpt-oss's
    `reasoning_effort`); the client's own kwargs win."""
    out = dict(kwargs or {})
    if effort is not None:
        out.setdefault("reasoning_effort", effort)
    return out


def tool_mode(
    choice: str | dict | None, tools: list[dict] | None, param: str = "tool_choice"
) -> tuple[ToolMode, str | None]:
    """OpenAI `tool_choice` as (mode, forced tool name)."""
    if choice is None:
        return "auto", None
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise BadRequest(f"Invalid '{param}': {choice!r}", param=param)
        return choice, None  # type: ignore[return-value]
    name = (
        (choice.get("function") or {}).get("name")
        or (choice.get("custom") or {}).get("name")
        or choice.get("name")
    )
    if not isinstance(name, str):
        raise BadRequest(f"Invalid '{param}': name the function to call", param=param)
    if name not in {t["function"]["name"] for t in tools or []}:
        raise BadRequest(f"Invalid '{param}': no tool named {name!r}", param=param)
    return "function", name


def text_of(content: Any, param: str, sep: str = "") -> str:
    """The text of a content field: a string, or a list of text parts joined by `sep`."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("text", "input_text", "output_text"):
            parts.append(str(part.get("text", "")))
        else:
            raise BadRequest(
                f"Invalid '{param}': only text content is supported (got {kind!r})", param=param
            )
    return sep.join(parts)


def arguments_object(arguments: Any) -> Any:
    """Tool-call arguments as an object: templates render dicts (`| tojson`), and a JSON
    string left as it is would be quoted a second time by most of them."""
    if isinstance(arguments, str):
        try:
            value = orjson.loads(arguments) if arguments.strip() else {}
        except orjson.JSONDecodeError:
            return arguments
        return value if isinstance(value, dict) else arguments
    return arguments


def tool_call_message(call_id: str | None, name: str | None, arguments: Any) -> dict:
    """An assistant tool call in the shape templates iterate over."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments_object(arguments)},
    }


# A `developer` message arrives as a system message carrying this key: the worker renders it
# as `developer` for a template that knows the role, else as `system` (worker/chat/prompts.py).
DEVELOPER_MARK = "_mlxd_developer"


def developer_as_system(message: dict[str, Any]) -> dict[str, Any]:
    """A `developer` message as the system message templates know, marked as one."""
    return {**message, "role": "system", DEVELOPER_MARK: True}


def late_system_indexes(messages: list[dict]) -> list[int]:
    """Positions of system messages after the conversation began (a non-system message)."""
    started, out = False, []
    for i, m in enumerate(messages):
        if m.get("role") != "system":
            started = True
        elif started:
            out.append(i)
    return out


def system_note(text: str) -> str:
    """A system message's text as a delimited note inside a user turn."""
    return f"<system_note>\n{text}\n</system_note>"


def fold_system_messages(messages: list[dict]) -> list[dict]:
    """The conversation with every system message after the first turn folded into a user
    turn, for chat templates that refuse a system message there (or silently drop it).

    Leading system messages merge into one; a later one becomes a `system_note` at the start
    of the next user turn, or at the end of the previous one when no user turn follows.
    The text is kept either way.
    """
    out: list[dict] = []
    pending: list[str] = []
    for m in messages:
        role, text = m.get("role"), m.get("content") or ""
        if role == "system" and all(o["role"] == "system" for o in out):
            if out:
                out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{text}"}
            else:
                out.append(m)
        elif role == "system":
            pending.append(system_note(text))
        elif role == "user" and pending:
            out.append({**m, "content": "\n\n".join([*pending, text])})
            pending = []
        else:
            out.append(m)
    if pending:
        users = [i for i, o in enumerate(out) if o["role"] == "user"]
        if users:
            last = out[users[-1]]
            out[users[-1]] = {**last, "content": "\n\n".join([last.get("content") or "", *pending])}
        else:
            out.append({"role": "user", "content": "\n\n".join(pending)})
    return out
