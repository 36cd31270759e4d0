"""Client tool lists as the chat template sees them: function tools, whatever the client sent.

Coding agents send more than function tools. Codex groups MCP tools in `namespace` entries,
declares freeform `custom` tools (its `apply_patch`, whose input is raw patch text) and lists
OpenAI's hosted tools (`web_search`, `local_shell`, `image_generation`, ...). A local model
can only call functions, so:

- a namespace's functions are flattened into the list under a qualified name
  (`qualified_name`), and a call to one is reported with its namespace and plain name again;
- a custom tool becomes a function taking one string argument, `input`; a call to it is
  reported as the custom tool call the client declared;
- hosted tools, which only the vendor's servers can run, are left out, and named in a
  `Warning` header (`ToolSet.warning`), as other ignored parts of a request are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from mlxd.shared.errors import BadRequest

CUSTOM_INPUT = "input"  # the one argument of a custom tool, as Codex's apply_patch reads it
_MAX_GRAMMAR_CHARS = 8000  # a longer grammar is left out of the description, not the tool


@dataclass(frozen=True)
class ToolOrigin:
    """What the client declared for a tool the template sees under another shape or name."""

    name: str
    namespace: str | None = None
    custom: bool = False


@dataclass
class ToolSet:
    """Function tools for the template, and what became of the client's other entries."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    origins: dict[str, ToolOrigin] = field(default_factory=dict)  # by the name the model uses
    dropped: list[str] = field(default_factory=list)  # hosted tool types left out

    @property
    def warning(self) -> str | None:
        """An RFC 7234 `Warning` value naming the hosted tools that were left out."""
        if not self.dropped:
            return None
        kinds = ", ".join(dict.fromkeys(self.dropped))
        # Client text in a header: ASCII without quotes or line breaks, and short.
        kinds = " ".join(kinds.replace('"', "'").split()).encode("ascii", "replace").decode()
        return (
            f"299 mlxd \"tools of type {kinds[:200]} were ignored: only the vendor's "
            f'servers can run them"'
        )


def qualified_name(namespace: str, name: str) -> str:
    """A namespaced tool's name for the model: Codex's MCP spelling (`mcp__server__tool`).

    Codex names its namespaces with the separator at the end (`mcp__server__`); others get
    `__` between the two parts.
    """
    return f"{namespace}{name}" if namespace.endswith("__") else f"{namespace}__{name}"


def _function(name: Any, description: Any, parameters: Any, param: str) -> dict[str, Any]:
    if not isinstance(name, str) or not name:
        raise BadRequest(f"Invalid '{param}.name': a non-empty string is required", param=param)
    if parameters is not None and not isinstance(parameters, dict):
        raise BadRequest(f"Invalid '{param}.parameters': must be an object", param=param)
    fn: dict[str, Any] = {"name": name}
    if isinstance(description, str) and description:
        fn["description"] = description
    fn["parameters"] = parameters or {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def _custom_function(spec: dict, param: str) -> dict[str, Any]:
    """A freeform tool as a function of one string: the grammar, if any, is described."""
    given = spec.get("description")
    description: str = given if isinstance(given, str) else ""
    fmt = spec.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        grammar = fmt.get("definition")
        if isinstance(grammar, str) and len(grammar) <= _MAX_GRAMMAR_CHARS:
            description += (
                f"\n\nThe `{CUSTOM_INPUT}` argument must follow this "
                f"{fmt.get('syntax') or ''} grammar:\n{grammar}"
            )
    schema = {
        "type": "object",
        "required": [CUSTOM_INPUT],
        "properties": {
            CUSTOM_INPUT: {"type": "string", "description": "The tool's whole input, as text"}
        },
    }
    return _function(spec.get("name"), description.strip(), schema, param)


class _Builder:
    def __init__(self):
        self.out = ToolSet()

    def add(self, tool: dict, origin: ToolOrigin | None = None) -> None:
        self.out.tools.append(tool)
        if origin is not None:
            self.out.origins[tool["function"]["name"]] = origin

    def namespace(self, entry: dict, param: str, child_spec) -> None:
        ns = entry.get("name")
        children = entry.get("tools")
        if not isinstance(ns, str) or not ns:
            raise BadRequest(f"Invalid '{param}.name': a namespace needs a name", param=param)
        if not isinstance(children, list):
            raise BadRequest(f"Invalid '{param}.tools': must be a list", param=param)
        for j, child in enumerate(children):
            spec = child_spec(child, f"{param}.tools.{j}")
            if spec is None:
                continue
            plain = spec["function"]["name"]
            spec["function"]["name"] = qualified_name(ns, plain)
            self.add(spec, ToolOrigin(plain, namespace=ns))


def _entry(tool: Any, param: str) -> tuple[str, dict]:
    if not isinstance(tool, dict):
        raise BadRequest(f"Invalid '{param}': a tool must be an object", param=param)
    kind = tool.get("type", "function")
    if not isinstance(kind, str):
        raise BadRequest(f"Invalid '{param}.type': must be a string", param=param)
    return kind, tool


def responses_tool_set(tools: list | None, param: str = "tools") -> ToolSet:
    """Responses API `tools`: {"type": "function", "name", "parameters"}, namespaces of
    those, `custom` tools and hosted tools (left out)."""
    return _tool_set(tools, param, lambda t, at, top: (t, at), lambda t, at: (t, at))


def chat_tool_set(tools: list | None, param: str = "tools") -> ToolSet:
    """Chat-completions `tools`: {"type": "function", "function": {...}}, `custom` tools
    ({"type": "custom", "custom": {...}}), namespaces and hosted tools (left out)."""

    def function_of(t: dict, at: str, top: bool) -> tuple[Any, str]:
        # At the top level the function sits under "function"; inside a namespace either
        # shape is taken.
        return (t.get("function") if top else t.get("function", t)), f"{at}.function"

    return _tool_set(
        tools, param, function_of, lambda t, at: (t.get("custom") or t, f"{at}.custom")
    )


def _tool_set(tools: list | None, param: str, function_of, custom_of) -> ToolSet:
    """One walk over a tool list for both surfaces; they differ only in where a function's
    and a custom tool's fields sit (`function_of`, `custom_of`)."""
    b = _Builder()

    def function(t: dict, at: str, top: bool) -> dict:
        fn, where = function_of(t, at, top)
        if not isinstance(fn, dict):
            raise BadRequest(f"Invalid '{where}': must be an object", param=at)
        return _function(fn.get("name"), fn.get("description"), fn.get("parameters"), where)

    def child(tool: Any, at: str) -> dict | None:
        kind, t = _entry(tool, at)
        if kind != "function":
            b.out.dropped.append(kind)
            return None
        return function(t, at, top=False)

    for i, tool in enumerate(tools or []):
        at = f"{param}.{i}"
        kind, t = _entry(tool, at)
        if kind == "function":
            b.add(function(t, at, top=True))
        elif kind == "namespace":
            b.namespace(t, at, child)
        elif kind == "custom":
            spec = _custom_function(*custom_of(t, at))
            b.add(spec, ToolOrigin(spec["function"]["name"], custom=True))
        else:
            b.out.dropped.append(kind)
    return b.out


def custom_input(arguments: str) -> str:
    """The text a model's call to a custom tool carries (its arguments, if not JSON)."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get(CUSTOM_INPUT), str):
        return value[CUSTOM_INPUT]
    return arguments
