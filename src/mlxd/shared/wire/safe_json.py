"""JSON for bodies that carry model-produced values: writing them cannot raise.

A model can write anything inside a tool call's arguments: integers beyond 64 bits, NaN, a
lone surrogate escape (`"\\ud800"`). orjson refuses the first and the last, which used to
break a request mid-stream. Here they become what every client's JSON parser reads
(docs/api.md, "Values a model writes"): an integer keeps its digits, NaN and ±Infinity are
`null` (as JavaScript's JSON.stringify writes them), and a lone surrogate becomes U+FFFD
(Rust's serde_json, which Codex uses, refuses lone surrogate escapes).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import orjson

# orjson writes integers from -2**63 to 2**64 - 1; beyond that its digits go in as they are.
_MIN_INT, _MAX_INT = -(2**63), 2**64 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


# orjson writes at most 254 levels of nesting, and a model can write more; the body around a
# value (a message, its content blocks) takes a few levels of its own
MAX_DEPTH = 200


def dumps(value: Any) -> bytes:
    """`orjson.dumps(value)`, with what orjson refuses made readable instead of raising; a
    value nested deeper than orjson writes is `null` (callers that must keep it check
    `writable` first)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        pass
    try:
        return orjson.dumps(readable(value))
    except (orjson.JSONEncodeError, RecursionError):
        return b"null"


def writable(value: Any, depth: int = 0) -> bool:
    """Whether `value` is nested shallowly enough for `dumps` to write it whole."""
    if depth > MAX_DEPTH:
        return False
    if isinstance(value, dict):
        return all(writable(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple):
        return all(writable(v, depth + 1) for v in value)
    return True


def readable(value: Any) -> Any:
    """`value` with big integers, non-finite floats and lone surrogates made writable."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if _MIN_INT <= value <= _MAX_INT else orjson.Fragment(str(value))
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, dict):
        return {_text(k) if isinstance(k, str) else k: readable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [readable(v) for v in value]
    return value


def _text(s: str) -> str:
    # A str holds a pair as one code point: any surrogate left in it is a lone one.
    return _SURROGATE.sub("\ufffd", s)


def loads_exact(text: str | bytes) -> Any:
    """Parse JSON a model wrote, keeping its integers exact (orjson reads 99999999999999999999
    as the float 1e20); NaN and Infinity are accepted as the model spelled them."""
    return json.loads(text)
