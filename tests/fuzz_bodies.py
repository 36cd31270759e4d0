"""Generated hostile requests for the public routes: mutations of valid bodies, and raw junk.

Deterministic for a seed: a failure names the seed and the case number, so it replays. Cases
are built from a valid body per route, then damaged one to three times (a field dropped, a value
swapped for an extreme or a wrong type, junk keys, deep nesting) or replaced by raw bytes. Every
generated body stays far under the daemon's body cap: the cap has its own test.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
import re
from dataclasses import dataclass, field

import orjson

NASTY = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**53 + 1,
    2**63 - 1,
    2**63,
    -(2**63),
    10**9,
    10**30,
    -(10**30),
    1e308,
    -1e308,
    1e-308,
    0.5,
    -0.5,
    3.7,
    "",
    " ",
    "a",
    "\x00",
    "\u202e",
    "💥" * 50,
    "<|im_start|>system",
    "{{ raise_exception('x') }}",
    "../../etc/passwd",
    "%2e%2e/admin",
    "x" * 5000,
    [],
    [None],
    [[[]]],
    {},
    {"": None},
    {"type": "text"},
    [{"role": "x"}],
    {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "string", "minLength": 10**9}},
    },
    {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "string", "pattern": ".{1,65535}"}},
    },
]

MSG = [{"role": "user", "content": "Say hi."}]
SEEDS: dict[str, dict] = {
    "/v1/chat/completions": {
        "model": "a",
        "messages": MSG,
        "max_tokens": 3,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "seed": 1,
        "stream": False,
        "logit_bias": {"5": 1.0},
        "stop": ["zz"],
        "logprobs": True,
        "top_logprobs": 2,
        "n": 1,
        "presence_penalty": 0.1,
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        ],
    },
    "/v1/completions": {
        "model": "a",
        "prompt": "Once",
        "max_tokens": 3,
        "temperature": 0.5,
        "seed": 2,
        "echo": False,
        "stop": "\n",
        "logprobs": 1,
    },
    "/v1/responses": {
        "model": "a",
        "input": "Say hi.",
        "max_output_tokens": 3,
        "instructions": "Be brief.",
        "store": False,
        "temperature": 0.3,
        "text": {"format": {"type": "text"}},
    },
    "/v1/messages": {
        "model": "a",
        "max_tokens": 3,
        "messages": MSG,
        "system": "Be brief.",
        "temperature": 0.5,
        "top_k": 4,
        "stop_sequences": ["zz"],
        "thinking": {"type": "disabled"},
    },
    "/v1/messages/count_tokens": {"model": "a", "messages": MSG, "system": "x"},
    "/admin/cache/session/close": {"session_id": "fuzz"},
}
# Values a model may write that JSON writers refuse (issue 31): beyond 64 bits, not finite,
# lone surrogates. guided_regex makes the tiny model write them into a tool call's arguments
# or its text, on each surface that parses tool calls, streamed or not.
MODEL_VALUES = [
    "99999999999999999999",
    "-1000000000000000000000000000000",
    "18446744073709551616",
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    '"\\ud800"',
    '"a\\udc00b"',
    '["\\ud83d", 99999999999999999999]',
    '{"\\udfff": NaN}',
]
_TOOL = {"type": "object"}
VALUE_BODIES: dict[str, dict] = {
    "/v1/chat/completions": {
        "model": "a",
        "messages": MSG,
        "max_tokens": 80,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": _TOOL}}],
    },
    "/v1/messages": {
        "model": "a",
        "messages": MSG,
        "max_tokens": 80,
        "tools": [{"name": "f", "input_schema": _TOOL}],
    },
    "/v1/responses": {
        "model": "a",
        "input": "Say hi.",
        "max_output_tokens": 80,
        "store": False,
        "tools": [{"type": "function", "name": "f", "parameters": _TOOL}],
    },
    "/api/chat": {
        "model": "a",
        "messages": MSG,
        "options": {"num_predict": 80},
        "tools": [{"type": "function", "function": {"name": "f", "parameters": _TOOL}}],
    },
}
# The same values sent by a client, in its messages and in earlier calls' arguments: a lone
# surrogate escape is not valid JSON text to orjson (a 400), the others must be served.
CLIENT_VALUES = [
    b'{"model": "a", "max_tokens": 3, "messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"model": "a", "max_tokens": 3, "messages": [{"role": "user", "content": "a\\udc00"}]}',
    b'{"model": "a", "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}, '
    b'{"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", '
    b'"function": {"name": "f", "arguments": "{\\"a\\": 99999999999999999999, '
    b'\\"b\\": NaN, \\"c\\": \\"\\\\ud800\\"}"}}]}, '
    b'{"role": "tool", "tool_call_id": "c", "content": "99999999999999999999"}]}',
    b'{"model": "a", "max_tokens": 3, "messages": [{"role": "user", "content": "Hi"}, '
    b'{"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", '
    b'"function": {"name": "f", "arguments": {"a": 99999999999999999999}}}]}]}',
]


def _value_case(rng: random.Random) -> Case:
    """A request whose model output, or whose own messages, carry such a value."""
    if rng.random() < 0.25:
        return Case("POST", "/v1/chat/completions", rng.choice(CLIENT_VALUES), dict(JSON_TYPE))
    value = rng.choice(MODEL_VALUES)
    call = '<tool_call>\n{"name": "f", "arguments": {"a": ' + value + "}}\n</tool_call>"
    text = call if rng.random() < 0.8 else "It is " + value
    path = rng.choice(list(VALUE_BODIES))
    body = {**VALUE_BODIES[path], "guided_regex": re.escape(text), "stream": rng.random() < 0.5}
    return Case("POST", path, json.dumps(body).encode(), dict(JSON_TYPE))


GET_PATHS = [
    "/health",
    "/v1/models",
    "/v1/models/a",
    "/v1/models/%00",
    "/admin/models",
    "/admin/stats",
    "/metrics",
    "/v1/responses/resp_x",
    "/v1/responses/x/input_items",
    "/admin/models/nope",
    "/admin/models/a/logs?lines=-5",
    "/admin/models/a/logs?lines=x",
]
ODD_PATHS = [
    "/v1/%2e%2e/admin/drain",
    "/v1/./chat/completions",
    "/v1/chat%2fcompletions",
    "/v1/..%2fadmin/drain",
    "/v1/chat/completions/../../admin/drain",
    "/v1/",
    "/v1/nope",
    "/v1/embeddings",
    "/admin/models/zz-none/unload",
    "/%2e%2e/etc",
    "/v1/chat/completions%00",
    "/v1//messages",
]
JSON_TYPE = {"content-type": "application/json"}
CONTENT_TYPES = ["application/json"] * 6 + [
    "text/plain",
    "",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/json; charset=latin-1",
]


@dataclass
class Case:
    """One request to send."""

    method: str
    path: str
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.method} {self.path} {self.headers} {self.body[:300]!r}"


def _nasty(rng: random.Random, depth: int = 0):
    pick = rng.random()
    if pick < 0.75 or depth > 3:
        return copy.deepcopy(rng.choice(NASTY))
    if pick < 0.85:
        return [_nasty(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if pick < 0.95:
        return {
            rng.choice(["type", "role", "content", "text", "name", "x"]): _nasty(rng, depth + 1)
            for _ in range(rng.randint(0, 3))
        }
    deep: list = []
    for _ in range(rng.randint(50, 200)):  # nesting that a recursive walker must survive
        deep = [deep]
    return deep


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


def _mutate(rng: random.Random, body: dict) -> dict:
    spots = [p for p in _paths(body) if p]
    path = rng.choice(spots)
    parent = body
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    roll = rng.random()
    if roll < 0.2 and isinstance(parent, dict):
        del parent[last]
    elif roll < 0.3 and isinstance(parent, dict):
        parent[
            rng.choice(
                [
                    "zz_unknown",
                    "n",
                    "stream",
                    "suffix",
                    "echo",
                    "best_of",
                    "response_format",
                    "logprobs",
                    "max_completion_tokens",
                    "reasoning_effort",
                    "tool_choice",
                    "prompt_cache_key",
                ]
            )
        ] = _nasty(rng)
    elif roll < 0.35 and isinstance(parent, list) and len(parent) < 40:
        parent.extend(copy.deepcopy(parent) * rng.randint(1, 3))
    else:
        parent[last] = _nasty(rng)
    return body


def _raw_junk(rng: random.Random) -> tuple[bytes, dict[str, str]]:
    kind = rng.randrange(7)
    if kind == 0:
        return b"", {}
    if kind == 1:
        return orjson.dumps(SEEDS["/v1/chat/completions"])[: rng.randint(1, 80)], {}
    if kind == 2:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 200))), {}
    if kind == 3:
        return rng.choice(
            [
                b"[]",
                b"null",
                b'"x"',
                b"1e999999",
                b'{"model": NaN}',
                b'{"a":1,"a":2}',
                b"\xff\xfe{}",
                b'{"model":"\xc3"}',
            ]
        ), {}
    if kind == 4:
        return b"\x1f\x8b\x08\x00garbage", {"content-encoding": "gzip"}
    if kind == 5:
        return b"not deflate", {"content-encoding": rng.choice(["deflate", "br", "zstd", "x"])}
    ok = gzip.compress(orjson.dumps(SEEDS["/v1/chat/completions"]))  # valid, compressed
    return ok, {"content-encoding": "gzip"}


VALUE_SHARE = 0.04  # each generates tokens: a small share keeps the run short


def generate(seed: int, n: int):
    """Yield `n` cases, the same ones for the same seed."""
    rng = random.Random(seed)
    posts = list(SEEDS)
    for _ in range(n):
        if rng.random() < VALUE_SHARE:
            yield _value_case(rng)
            continue
        roll = rng.random()
        if roll < 0.06:
            yield Case("GET", rng.choice(GET_PATHS))
            continue
        path = rng.choice(ODD_PATHS) if roll < 0.12 else rng.choice(posts)
        headers = {"content-type": rng.choice(CONTENT_TYPES)}
        if roll < 0.25:
            body, extra = _raw_junk(rng)
            headers.update(extra)
        else:
            data = copy.deepcopy(SEEDS.get(path, SEEDS["/v1/chat/completions"]))
            for _ in range(rng.randint(1, 3)):
                data = _mutate(rng, data) if data else data
            # json, not orjson: big integers (10**30) must reach the server too
            body = json.dumps(data).encode() if isinstance(data, dict) else b"{}"
        if rng.random() < 0.03:
            headers["origin"] = rng.choice(["https://evil.example", "null", "http://localhost:1"])
        if not headers["content-type"]:
            del headers["content-type"]
        yield Case("POST", path, body, headers)
