"""Parse a raw request body into a wire model, turning every client mistake into a 400."""

from __future__ import annotations

from typing import TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from mlxd.shared.errors import BadRequest

M = TypeVar("M", bound=BaseModel)


class Lenient(BaseModel):
    """The base of request bodies: fields a surface does not know are accepted (clients send
    extras), the ones it knows are strictly typed."""

    model_config = ConfigDict(extra="allow", strict=True)


def load_json(raw: bytes) -> dict:
    """Decode a JSON object body or raise BadRequest."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"Request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest("Request body must be a JSON object")
    return data


def parse_model(cls: type[M], data: dict) -> M:
    """Validate `data` as `cls`; the first error becomes a 400 naming its field."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in err["loc"] if not _is_type_tag(p))
        msg = err["msg"].removeprefix("Value error, ")
        raise BadRequest(f"Invalid '{loc}': {msg}" if loc else msg, param=loc or None) from None


def _is_type_tag(part) -> bool:
    # Pydantic adds union-member tags such as "str" or "list[int]" to error locations.
    return isinstance(part, str) and (part in {"str", "int", "float", "bool"} or "[" in part)
