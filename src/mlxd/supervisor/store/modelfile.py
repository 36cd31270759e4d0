"""The Modelfile subset /api/create takes, and what it sets of a model's settings.

`FROM` (a model, or an absolute path to a GGUF file or a model folder on this machine),
`PARAMETER` (temperature, top_p, top_k, min_p, num_predict → max_tokens, num_ctx →
context_limit), `SYSTEM` and `TEMPLATE` (a Jinja chat template, as in tokenizer_config.json).
Everything else (ADAPTER, LICENSE, MESSAGE, other parameters, Ollama's Go templates) is a 400
naming it. Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from mlxd.shared.errors import BadRequest
from mlxd.shared.folder_settings import FolderSettings

# Ollama's parameter → (the setting it sets, its type).
PARAMETERS: dict[str, tuple[str, type]] = {
    "temperature": ("temperature", float),
    "top_p": ("top_p", float),
    "top_k": ("top_k", int),
    "min_p": ("min_p", float),
    "num_predict": ("max_tokens", int),
    "num_ctx": ("context_limit", int),
}
COMMANDS = ("FROM", "PARAMETER", "SYSTEM", "TEMPLATE")
REFUSED = ("ADAPTER", "LICENSE", "MESSAGE", "REQUIRES")
# Go template actions: `{{ .Prompt }}`, `{{ if .System }}`, `{{ range .Messages }}`, `{{ end }}`
GO_TEMPLATE = re.compile(r"\{\{-?\s*(?:\.|(?:if|range|with)\s+[.$]|end\s*-?\}\}|else\s*-?\}\})")


@dataclass
class CreateSpec:
    """What a create asks for: its source, and the settings the new model gets."""

    source: str | None = None
    system: str | None = None
    template: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


def _unquote(value: str, lines: list[str], i: int) -> tuple[str, int]:
    """A value as written: in triple quotes (may span lines), in quotes, or bare; and the
    next line."""
    if value.startswith('"""'):
        rest = value[3:]
        parts = []
        while '"""' not in rest:
            parts.append(rest)
            i += 1
            if i >= len(lines):
                raise BadRequest('Invalid \'modelfile\': a """ string is not closed')
            rest = lines[i]
        parts.append(rest[: rest.index('"""')])
        return "\n".join(parts), i + 1
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].replace('\\"', '"'), i + 1
    return value, i + 1


def parse_modelfile(text: str) -> CreateSpec:
    """A Modelfile's instructions, or a 400 naming the first one mlxd does not take."""
    spec = CreateSpec()
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if not line or line.startswith("#"):
            i += 1
            continue
        command, _, rest = line.partition(" ")
        command, rest = command.upper(), rest.strip()
        if command in REFUSED:
            raise BadRequest(f"Invalid 'modelfile': {command} is not supported", param="modelfile")
        if command not in COMMANDS:
            raise BadRequest(
                f"Invalid 'modelfile': unknown instruction {command[:40]} "
                f"(mlxd takes {', '.join(COMMANDS)})",
                param="modelfile",
            )
        if command == "PARAMETER":
            name, _, raw = rest.partition(" ")
            value, i = _unquote(raw.strip(), lines, i)
            old = spec.parameters.get(name.lower())  # `PARAMETER stop` may repeat: a list
            spec.parameters[name.lower()] = value if old is None else [*_listed(old), value]
            continue
        value, i = _unquote(rest, lines, i)
        if command == "FROM":
            spec.source = value
        elif command == "SYSTEM":
            spec.system = value
        else:
            spec.template = value
    return spec


def _listed(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _convert(name: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool) or isinstance(value, (list, dict)):
        raise BadRequest(f"PARAMETER {name}: {str(value)[:60]!r} is not a number")
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    try:
        return kind(value) if kind is float else int(str(value))
    except (TypeError, ValueError):
        raise BadRequest(f"PARAMETER {name}: {str(value)[:60]!r} is not a number") from None


def check_template(template: str) -> str:
    """A Jinja chat template that parses, else a 400 that says what is wrong with it."""
    if GO_TEMPLATE.search(template):
        raise BadRequest(
            "TEMPLATE is in Ollama's Go template syntax ({{ .Prompt }}); mlxd's chat templates "
            "are Jinja, as in a model's tokenizer_config.json",
            param="template",
        )
    if "{{" not in template and "{%" not in template:
        raise BadRequest("TEMPLATE is not a Jinja chat template", param="template")
    from jinja2 import Environment, TemplateSyntaxError

    try:
        Environment().parse(template)
    except TemplateSyntaxError as exc:
        raise BadRequest(f"TEMPLATE is not valid Jinja: {exc.message}", param="template") from None
    return template


def folder_settings(spec: CreateSpec) -> FolderSettings:
    """The settings a create's PARAMETER, SYSTEM and TEMPLATE give the new model."""
    values: dict[str, Any] = {}
    for name, value in spec.parameters.items():
        if name not in PARAMETERS:
            raise BadRequest(
                f"PARAMETER {name[:40]} is not supported (mlxd keeps "
                f"{', '.join(PARAMETERS)} per model)",
                param="parameters",
            )
        setting, kind = PARAMETERS[name]
        converted = _convert(name, value, kind)
        if not (setting == "max_tokens" and converted < 0):  # -1, -2: up to the context
            values[setting] = converted
    if spec.system is not None:
        values["system"] = spec.system
    if spec.template is not None:
        values["chat_template"] = check_template(spec.template)
    try:
        return FolderSettings(**values)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        setting = str(err["loc"][0])
        shown = next((p for p, (s, _) in PARAMETERS.items() if s == setting), setting)
        raise BadRequest(f"PARAMETER {shown}: {err['msg']}", param="parameters") from None
