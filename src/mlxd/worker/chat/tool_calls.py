"""Tool calls: parse the model's tool-call blocks, and force a call with a grammar.

The format belongs to the model family: mlx-lm infers a parser from the chat template
(`tokenizer.tool_parser`, between `tool_call_start` and `tool_call_end`). Forcing a call
(`tool_choice` "required" or a named function) needs the format as a regex; that is known for
the JSON-in-tags family (Hermes, Qwen 2.5/3: `<tool_call>{"name": …, "arguments": …}`).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from mlxd.shared.chat_job import ChatJob
from mlxd.shared.structured_output import GuidedSpec
from mlxd.shared.wire.safe_json import dumps, loads_exact, writable

log = logging.getLogger("mlxd.worker.tools")


@dataclass
class ToolCall:
    """One parsed call; `arguments` is a JSON object as a string (OpenAI's shape)."""

    id: str
    name: str
    arguments: str
    index: int = 0
    streamed: bool = False  # its start and arguments went out as written (events.py)

    @property
    def input(self) -> dict:
        """The arguments as an object (Anthropic's `input`)."""
        try:
            value = loads_exact(self.arguments)
        except (ValueError, RecursionError):
            return {}
        return value if isinstance(value, dict) else {"value": value}


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# The call format of models whose tokenizer has no tool parser: tool_prompt.py asks for it
# (JSON in tags, as Hermes and Qwen write it) when the chat template has no tool format.
FALLBACK_MARKERS = ("<tool_call>", "</tool_call>")


def _native(tokenizer) -> bool:
    return bool(
        getattr(tokenizer, "has_tool_calling", False)
        and getattr(tokenizer, "tool_parser", None) is not None
    )


def markers(tokenizer) -> tuple[str, str]:
    """The strings around a tool call in this model's output."""
    if _native(tokenizer):
        return tokenizer.tool_call_start, tokenizer.tool_call_end
    return FALLBACK_MARKERS


def _parse_fallback(text: str, tools: list[dict] | None) -> dict | list:
    return loads_exact(text.strip())  # as mlx-lm's own JSON parser reads a call


def parse_block(
    tokenizer, text: str, tools: list[dict] | None, first_index: int
) -> list[ToolCall] | None:
    """The calls in one block (the text between the markers), or None if it does not parse."""
    parser = tokenizer.tool_parser if _native(tokenizer) else _parse_fallback
    try:
        parsed = parser(text, tools)
    except Exception as exc:  # every parser raises its own errors on malformed output
        log.info("unparsable tool call (%s): %.200r", exc, text)
        return None
    calls = []
    for i, item in enumerate(parsed if isinstance(parsed, list) else [parsed]):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        args = item.get("arguments", {})
        if not isinstance(args, str) and not writable(args):
            log.info("tool call arguments nested too deep to write: %.200r", text)
            return None  # the block stays text: every surface can carry that
        if not isinstance(args, str):  # whatever the model wrote in it stays writable
            args = dumps(args).decode()
        call_id = item.get("id")
        calls.append(
            ToolCall(
                id=call_id if isinstance(call_id, str) and call_id else new_call_id(),
                name=item["name"],
                arguments=args,
                index=first_index + i,
            )
        )
    return calls


def streamable(tokenizer) -> bool:
    """Whether this model's calls are JSON in tags, the format whose arguments stream as
    they are written (tool_stream.py); other formats' calls go out whole."""
    return not _native(tokenizer) or _json_in_tags(tokenizer)


def forced_call_spec(tokenizer, job: ChatJob) -> GuidedSpec | None:
    """A grammar that makes the model call a tool, when the job demands one and we know the
    family's format; None otherwise (the template and the model decide). Its regex is built
    where every grammar is, in the compile child (grammar/compile_child.py `tool_call_regex`):
    a client's parameters schema can expand to gigabytes (optional properties grow
    quadratically), which in the worker stalled the model's event loop."""
    if job.tool_mode not in ("required", "function") or not job.tools:
        return None
    if not _json_in_tags(tokenizer):
        return None
    tools = [
        {"name": t["function"]["name"], "parameters": t["function"].get("parameters")}
        for t in job.tools
        if job.tool_mode == "required" or t["function"]["name"] == job.forced_tool
    ]
    value = {"start": tokenizer.tool_call_start, "end": tokenizer.tool_call_end, "tools": tools}
    return GuidedSpec("tool_call", value, "tool_choice")


def _json_in_tags(tokenizer) -> bool:
    parser = getattr(tokenizer, "tool_parser", None)
    return parser is not None and getattr(parser, "__module__", "").endswith(".json_tools")
