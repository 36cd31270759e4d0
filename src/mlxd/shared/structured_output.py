"""Structured-output requests: what a client asked the sampler to enforce.

Every API surface turns its own fields (OpenAI `response_format`, vLLM-style `guided_*`,
Responses `text.format`) into one `GuidedSpec`; the worker compiles it into a grammar.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

# "tool_call": a forced call in the JSON-in-tags format, {start, end, tools: [{name,
# parameters}]} (worker/chat/tool_calls.py forced_call_spec).
GuidedKind = Literal["json_object", "json_schema", "regex", "choice", "grammar", "tool_call"]


@dataclass(frozen=True)
class GuidedSpec:
    """One constraint on a row's output. `param` names the field the client used."""

    kind: GuidedKind
    value: Any = None  # schema dict, regex, list of choices or grammar text
    param: str = "response_format"

    def instruction(self) -> str:
        """The same request as plain words, for when the constraint cannot be compiled."""
        if self.kind == "json_object":
            return "Respond with a single JSON object and nothing else."
        if self.kind == "json_schema":
            schema = orjson.dumps(self.value).decode()
            return (
                "Respond with a single JSON object that validates against this JSON schema, "
                f"and nothing else:\n{schema}"
            )
        if self.kind == "choice":
            return "Respond with exactly one of: " + ", ".join(map(str, self.value))
        if self.kind == "regex":
            return f"Respond with text that matches this regular expression: {self.value}"
        if self.kind == "tool_call":
            names = ", ".join(str(t.get("name")) for t in self.value["tools"])
            return f"Respond with a call to one of these tools and nothing else: {names}"
        return f"Respond with text that follows this grammar:\n{self.value}"


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)


class JsonSchemaFormat(_Lenient):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Lenient):
    """OpenAI chat `response_format`."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _needs_schema(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type json_schema needs 'json_schema'")
        return self

    def to_guided_spec(self, param: str = "response_format") -> GuidedSpec | None:
        if self.type == "json_object":
            return GuidedSpec("json_object", None, param)
        if self.type == "json_schema" and self.json_schema is not None:  # the validator saw to it
            return GuidedSpec("json_schema", self.json_schema.schema_ or {"type": "object"}, param)
        return None


class GuidedFields(_Lenient):
    """`response_format` plus vLLM's extra body fields; at most one may be set."""

    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(None, min_length=1)
    guided_grammar: str | None = None

    @model_validator(mode="after")
    def _one_constraint(self):
        given = [
            k
            for k in ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
            if getattr(self, k) is not None
        ]
        if self.response_format is not None and self.response_format.type != "text":
            given.append("response_format")
        if len(given) > 1:
            raise ValueError(f"only one of {', '.join(given)} may be set")
        if isinstance(self.guided_json, str):
            try:
                self.guided_json = orjson.loads(self.guided_json)
            except orjson.JSONDecodeError:
                raise ValueError("guided_json is not a JSON schema") from None
        return self

    def to_guided_spec(self) -> GuidedSpec | None:
        """The one constraint this request asks for, if any."""
        if self.guided_json is not None:
            return GuidedSpec("json_schema", self.guided_json, "guided_json")
        if self.guided_regex is not None:
            return GuidedSpec("regex", self.guided_regex, "guided_regex")
        if self.guided_choice is not None:
            return GuidedSpec("choice", list(self.guided_choice), "guided_choice")
        if self.guided_grammar is not None:
            return GuidedSpec("grammar", self.guided_grammar, "guided_grammar")
        if self.response_format is not None:
            return self.response_format.to_guided_spec()
        return None
