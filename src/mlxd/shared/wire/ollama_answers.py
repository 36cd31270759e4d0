"""Ollama API answers: chat and generate (whole, or one NDJSON line each), the model listings
(/api/tags, /api/ps, /api/show), embeddings, and the names and times they carry."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal

from pydantic import BaseModel, Field, model_serializer

from mlxd.shared.wire.ollama import LATEST

# The Ollama API release whose fields and answers this surface follows (GET /api/version).
OLLAMA_VERSION = "0.12.0"


def ollama_name(model_id: str) -> str:
    """An mlxd id as Ollama clients list it: "name:tag", the tag being "latest"."""
    return model_id if ":" in model_id.rsplit("/", 1)[-1] else model_id + LATEST


def timestamp(when: float | None = None) -> str:
    """RFC 3339 in UTC, as Ollama writes `created_at` and `modified_at`."""
    at = datetime.now(timezone.utc) if when is None else datetime.fromtimestamp(when, timezone.utc)
    return at.isoformat().replace("+00:00", "Z")


class _Out(BaseModel):
    @model_serializer(mode="wrap")
    def _set_only(self, handler):
        # Ollama leaves out what it has nothing for (thinking, tool_calls, final counts).
        return {k: v for k, v in handler(self).items() if v is not None}


class ToolCallOut(_Out):
    function: dict[str, Any]  # {"index", "name", "arguments": {...}}
    id: str | None = None


class MessageOut(_Out):
    role: Literal["assistant"] = "assistant"
    content: str = ""
    thinking: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class _Answer(_Out):
    model: str
    created_at: str = Field(default_factory=timestamp)
    done: bool = False
    done_reason: str | None = None
    total_duration: int | None = None  # nanoseconds, as Ollama counts
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None
    logprobs: list[dict[str, Any]] | None = None


class ChatAnswer(_Answer):
    message: MessageOut = Field(default_factory=MessageOut)


class GenerateAnswer(_Answer):
    response: str = ""
    thinking: str | None = None


class ModelDetails(BaseModel):
    parent_model: str = ""
    format: str = "mlx"
    family: str = ""
    families: list[str] | None = None
    parameter_size: str = ""
    quantization_level: str = ""


class TagModel(BaseModel):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: ModelDetails


class Tags(BaseModel):
    models: list[TagModel]


class RunningModel(TagModel):
    expires_at: str
    size_vram: int
    context_length: int | None = None


class Running(BaseModel):
    models: list[RunningModel]


class ShowAnswer(BaseModel):
    license: str = ""
    modelfile: str
    parameters: str
    template: str
    details: ModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class _Vector(BaseModel):
    embedding: list[float]
    index: int = 0


class _TokenCount(BaseModel):
    prompt_tokens: int = 0


class WorkerEmbeddings(BaseModel):
    """The worker's /v1/embeddings answer (OpenAI's shape, floats), as /api/embed reads it."""

    data: list[_Vector]
    usage: _TokenCount = _TokenCount()


class EmbedAnswer(BaseModel):
    model: str
    embeddings: list[list[float]]
    total_duration: int = 0
    load_duration: int = 0
    prompt_eval_count: int = 0
