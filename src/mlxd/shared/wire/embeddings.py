"""OpenAI embeddings wire bodies: POST /v1/embeddings and its answer.

`input` is a string, a list of strings, a list of token ids, or a list of token-id lists, as
OpenAI takes it; every input becomes one vector. Vectors go out as JSON floats or, with
`encoding_format: "base64"`, as the base64 of their little-endian float32 bytes (what the
OpenAI SDKs decode).
"""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np
import orjson
from pydantic import BaseModel, Field, field_validator

from mlxd.shared.wire.bodies import Lenient

# OpenAI's own bound on inputs per request.
MAX_INPUTS = 2048


class EmbeddingRequest(Lenient):
    """POST /v1/embeddings. Unknown fields are ignored, as in the other OpenAI bodies."""

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    # mlxd extension (Ollama's `truncate`): cut inputs longer than the context, not a 400.
    truncate: bool = False

    @field_validator("input")
    @classmethod
    def _check_input(cls, v):
        items = [v] if isinstance(v, str) else v
        if not items:
            raise ValueError("must not be empty")
        if isinstance(items[0], int):  # one token-id list is one input
            items = [items]
        if len(items) > MAX_INPUTS:
            raise ValueError(f"at most {MAX_INPUTS} inputs per request, got {len(items)}")
        for i, item in enumerate(items):
            if len(item) == 0:
                raise ValueError(f"input {i} is empty")
        return v

    def inputs(self) -> list[str | list[int]]:
        """The request's inputs, one per vector: strings or token-id lists."""
        v = self.input
        if isinstance(v, str):
            return [v]
        if v and isinstance(v[0], int):
            return [list(v)]
        return list(v)  # type: ignore[arg-type]


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str
    index: int


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    """The answer: one `Embedding` per input, in input order."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


def encode_base64(vector: np.ndarray) -> str:
    """A vector as OpenAI's base64 encoding: little-endian float32 bytes."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def embedding_list_bytes(
    vectors: list[np.ndarray], model: str, prompt_tokens: int, encoding_format: str
) -> bytes:
    """The JSON of an EmbeddingList for `vectors`.

    Serialized directly (orjson writes float32 arrays natively): going through the pydantic
    models would cost seconds for a full request of wide vectors. The shape is EmbeddingList's.
    """
    data = [
        {
            "object": "embedding",
            "embedding": encode_base64(v) if encoding_format == "base64" else v,
            "index": i,
        }
        for i, v in enumerate(vectors)
    ]
    usage = EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
    body = {"object": "list", "data": data, "model": model, "usage": usage.model_dump()}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
