"""Tools for a chat template that has no tool format: described in a system section instead.

Templates such as SmolLM2's ignore `tools` and drop `tool_calls` from assistant turns, while
tool results still render: the model would read results of calls it never made, with no idea
that it can call anything. When a template renders tools, nothing here applies. Otherwise the
tool list goes into the system message, earlier calls stay in their assistant turns as text
in the one format the worker then parses (tool_calls.FALLBACK_MARKERS), and tool results
become user turns holding the result as text.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import orjson

from mlxd.worker.chat.tool_calls import FALLBACK_MARKERS
from mlxd.worker.grammar.processor import warning_header

log = logging.getLogger("mlxd.worker.tools")

WARNING = warning_header(
    "tools",
    "this model's chat template has no tool format",
    "the tools were described in a system message instead",
)
_PROBE_NAME = "mlxd_probe_tool_4f1c"
_PROBE = [
    {
        "type": "function",
        "function": {
            "name": _PROBE_NAME,
            "description": "probe",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]
# tokenizer -> whether its template renders `tools`; one probe (and one log line) per model.
_RENDERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def template_renders_tools(tokenizer, model_id: str = "") -> bool:
    """Whether the chat template shows a tool list given as `tools` (probed once per model)."""
    try:
        return _RENDERS[tokenizer]
    except (KeyError, TypeError):
        pass
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}],
            tools=_PROBE,
            add_generation_prompt=True,
            tokenize=False,
        )
        renders = _PROBE_NAME in text
    except Exception:  # a template that refuses `tools` renders none either
        renders = False
    if not renders:
        log.warning(
            "model=%s: the chat template has no tool format; tools are described in "
            "a system message and calls parsed as %s…%s",
            model_id or "?",
            *FALLBACK_MARKERS,
        )
    try:
        _RENDERS[tokenizer] = renders
    except TypeError:  # not weak-referenceable: probe again next time
        pass
    return renders


def tool_section(tools: list[dict]) -> str:
    """The system-prompt text that lists the tools and the exact call format."""
    start, end = FALLBACK_MARKERS
    lines = [
        "# Tools",
        "",
        "You may call one or more of the functions below. To call one, answer with a block "
        "exactly like this one (one block per call), and nothing after your last block:",
        start,
        '{"name": "<function name>", "arguments": {<the arguments as a JSON object>}}',
        end,
        "Each call's result comes back in the next user turn, inside <tool_response> tags.",
        "",
        "Functions, as JSON (name, description, parameters as a JSON schema):",
    ]
    for t in tools:
        fn = t.get("function", t)
        entry = {
            "name": fn.get("name"),
            "description": fn.get("description") or "",
            "parameters": fn.get("parameters") or {"type": "object", "properties": {}},
        }
        lines.append(orjson.dumps(entry).decode())
    return "\n".join(lines)


def call_text(call: dict) -> str:
    """One earlier call (OpenAI `tool_calls` entry) in the format the model is told to use."""
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = orjson.loads(args)
        except orjson.JSONDecodeError:
            pass  # kept as the string the client sent
    body = orjson.dumps({"name": fn.get("name"), "arguments": args}).decode()
    return f"{FALLBACK_MARKERS[0]}\n{body}\n{FALLBACK_MARKERS[1]}"


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "")
            for p in content
            if isinstance(p, dict) and p.get("type", "text") == "text"
        )
    return str(content)


_RESULTS = "_mlxd_tool_results"  # marks a user turn made of tool results, while building


def _append_user(out: list[dict], content: str | list[dict]) -> None:
    """Results (and the user text right after them) share one user turn: many templates
    refuse two user turns in a row. A turn with images (`content` as parts) keeps them."""
    if not (out and out[-1].get(_RESULTS)):
        out.append({"role": "user", "content": content, _RESULTS: True})
    elif isinstance(content, str) and isinstance(out[-1]["content"], str):
        out[-1]["content"] += "\n" + content
    else:
        out[-1]["content"] = [*_parts(out[-1]["content"]), *_parts("\n"), *_parts(content)]


def _parts(content: str | list[dict]) -> list[dict]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def with_tools_as_text(messages: list[dict], tools: list[dict]) -> list[dict]:
    """A copy of `messages` with the tools, calls and results spelled out as text."""
    section = tool_section(tools)
    out: list[dict] = []
    for msg in messages:
        role = msg.get("role")
        if role == "assistant" and msg.get("tool_calls"):
            calls = "\n".join(call_text(c) for c in msg["tool_calls"])
            text = _text(msg.get("content"))
            rest = {k: v for k, v in msg.items() if k != "tool_calls"}
            out.append({**rest, "content": f"{text}\n{calls}" if text else calls})
        elif role == "tool":
            result = f"<tool_response>\n{_text(msg.get('content'))}\n</tool_response>"
            _append_user(out, result)
        elif role == "user" and out and out[-1].get(_RESULTS):
            content = msg.get("content")
            _append_user(out, content if isinstance(content, list) else _text(content))
        else:
            out.append(msg)
    out = [{k: v for k, v in m.items() if k != _RESULTS} for m in out]
    if out and out[0].get("role") == "system":
        first = _text(out[0].get("content"))
        out[0] = {**out[0], "content": f"{first}\n\n{section}" if first else section}
    else:
        out.insert(0, {"role": "system", "content": section})
    return out
