"""One chat-shaped generation, whatever API surface asked for it.

OpenAI chat, Anthropic Messages and the Responses API each convert their request into a
`ChatJob` (`to_chat_job()`): messages as the chat template expects them, tools in OpenAI's
function shape, the tool choice, template switches, sampling parameters and a structured-output
constraint. Legacy completions convert into one too, carrying a `RawPrompt` instead of
messages. The worker runs every job through one driver (worker/api/driver.py).

Images (shared/images.py) ride in `images`, in the order they appear; a message that holds any
gets its content as a list of parts, `{"type": "text", "text": ...}` and `{"type": "image"}`
(what vision-language chat templates iterate over). Every other message keeps string content.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from mlxd.shared.errors import BadRequest
from mlxd.shared.images import ImageInput
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
    images: list[ImageInput] = field(default_factory=list)  # every message's, in order

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


TEXT_KINDS = ("text", "input_text", "output_text")
# Image parts of every surface (OpenAI chat, Responses, Anthropic), for the refusal outside
# user messages.
IMAGE_KINDS = ("image_url", "input_image", "image")
IMAGE_PART = {"type": "image"}

# How a surface reads one of its content parts as an image: the ImageInput, or None when the
# part is not an image at all (a 400 about its type follows).
ImageOf = Callable[[dict[str, Any], str], ImageInput | None]


def part_text(part: dict[str, Any], param: str) -> str:
    """A text part's `text` (absent: empty); any other type is a 400 naming it."""
    text = part.get("text", "")
    if not isinstance(text, str):
        raise BadRequest(f"Invalid '{param}.text': expected a string", param=f"{param}.text")
    return text


def text_of(content: Any, param: str, sep: str = "") -> str:
    """The text of a content field: a string, or a list of text parts joined by `sep`.

    For content that must stay text (system, assistant, tool results): an image part here is
    a 400 saying images go in user messages."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(
            f"Invalid '{param}': expected a string or a list of content parts", param=param
        )
    parts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_KINDS:
            parts.append(part_text(part, f"{param}.{i}"))
        elif kind in IMAGE_KINDS:
            raise BadRequest(
                f"Invalid '{param}': images are accepted in user messages only", param=param
            )
        else:
            raise BadRequest(
                f"Invalid '{param}': only text content is supported (got {kind!r})", param=param
            )
    return sep.join(parts)


def content_parts(
    content: Any, param: str, images: list[ImageInput], image_of: ImageOf, sep: str = ""
) -> str | list[dict[str, Any]]:
    """A user message's content: its text (as `text_of` joins it) when it holds no image,
    else its parts in order, text and `{"type": "image"}`, each image appended to `images`."""
    if not isinstance(content, list) or not any(
        isinstance(p, dict) and p.get("type") not in TEXT_KINDS for p in content
    ):
        return text_of(content, param, sep)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_KINDS:
            parts.append({"type": "text", "text": part_text(part, f"{param}.{j}")})
            continue
        image = image_of(part, f"{param}.{j}") if isinstance(part, dict) else None
        if image is None:
            raise BadRequest(
                f"Invalid '{param}.{j}': content of type {kind!r} is not supported "
                "(text and images are)",
                param=f"{param}.{j}",
            )
        images.append(image)
        parts.append(dict(IMAGE_PART))
    return parts


def refuse_images(job: ChatJob, model_id: str) -> None:
    """A 400 when `job` carries images for a model without vision (no images: nothing)."""
    if job.images:
        raise BadRequest(
            f"model '{model_id}' does not accept images: it has no vision capability "
            "(send text only, or use a vision-language model)",
            param=job.images[0].param,
        )


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
            out.append({**m, "content": _joined(pending, m.get("content") or "")})
            pending = []
        else:
            out.append(m)
    if pending:
        users = [i for i, o in enumerate(out) if o["role"] == "user"]
        if users:
            last = out[users[-1]]
            out[users[-1]] = {**last, "content": _joined([], last.get("content") or "", pending)}
        else:
            out.append({"role": "user", "content": "\n\n".join(pending)})
    return out


def _joined(
    before: list[str], content: str | list[dict[str, Any]], after: Sequence[str] = ()
) -> str | list[dict[str, Any]]:
    """`content` with notes before and after it, a blank line apart; content made of parts
    (images) gets them as text parts of their own."""
    if isinstance(content, str):
        return "\n\n".join([*before, content, *after])
    head = [{"type": "text", "text": "\n\n".join(before) + "\n\n"}] if before else []
    tail = [{"type": "text", "text": "\n\n" + "\n\n".join(after)}] if after else []
    return [*head, *content, *tail]
