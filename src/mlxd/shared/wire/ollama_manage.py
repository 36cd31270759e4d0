"""Ollama API bodies for managing models: /api/pull, /api/delete, /api/copy, /api/create, and
the progress lines pull and create stream (docs/api.md, "Managing models").

Fields Ollama defines that mlxd cannot honour are a 400 naming them (`insecure` pulls, blob
`files`, `adapters`, `quantize`, `messages`, `license`); `revision` on a pull is mlxd's own.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mlxd.shared.errors import BadRequest
from mlxd.shared.wire.bodies import Lenient


def _name(model: str | None, name: str | None) -> str:
    """`model`, or the older `name`; one is required."""
    value = model or name
    if not value:
        raise BadRequest("Invalid 'model': a model name is required", param="model")
    if len(value) > 300:
        raise BadRequest("Invalid 'model': at most 300 characters", param="model")
    return value


class PullRequest(Lenient):
    """POST /api/pull: a Hugging Face repository (org/name) or a name of mlxd's table."""

    model: str | None = None
    name: str | None = None
    insecure: bool = False
    stream: bool = True
    revision: str | None = Field(None, min_length=1, max_length=200)  # mlxd: branch, tag, commit

    @property
    def model_name(self) -> str:
        if self.insecure:
            raise BadRequest("Invalid 'insecure': mlxd pulls over HTTPS only", param="insecure")
        return _name(self.model, self.name)


class DeleteRequest(Lenient):
    """DELETE /api/delete."""

    model: str | None = None
    name: str | None = None

    @property
    def model_name(self) -> str:
        return _name(self.model, self.name)


class CopyRequest(Lenient):
    """POST /api/copy."""

    source: str = Field(min_length=1, max_length=300)
    destination: str = Field(min_length=1, max_length=300)


# Create fields mlxd refuses, and why (a 400 naming the field).
UNSUPPORTED_CREATE = {
    "files": "blob uploads are not supported: give 'from' a GGUF file or a model folder "
    "on this machine",
    "adapters": "LoRA adapters are not supported",
    "quantize": "quantizing is not supported: pull or create an already quantized model",
    "messages": "MESSAGE (a conversation kept with the model) is not supported",
    "license": "LICENSE is not supported",
    "path": "a Modelfile path is not supported: send its text as 'modelfile'",
}


class CreateRequest(Lenient):
    """POST /api/create: `from` (a model, or an absolute path to a GGUF file or a model
    folder on this machine), `system`, `template`, `parameters`; or the older `modelfile`."""

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)

    model: str | None = None
    name: str | None = None
    from_: str | None = Field(None, alias="from", min_length=1, max_length=4096)
    modelfile: str | None = Field(None, max_length=1 << 20)
    system: str | None = None
    template: str | None = None
    parameters: dict[str, Any] | None = None
    stream: bool = True

    @property
    def model_name(self) -> str:
        return _name(self.model, self.name)

    def refuse_unsupported(self) -> None:
        """A 400 naming the first field mlxd does not support."""
        extra = self.model_extra or {}
        for field, why in UNSUPPORTED_CREATE.items():
            if extra.get(field) not in (None, "", [], {}):
                raise BadRequest(f"Invalid '{field}': {why}", param=field)


class ProgressLine(BaseModel):
    """One line of a pull's or a create's progress, in Ollama's shape: a status, and for a
    file being downloaded its digest, total and completed bytes."""

    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)
