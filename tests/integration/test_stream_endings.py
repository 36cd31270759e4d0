"""A stream that breaks still ends: the surface's error event and its terminator, on every
surface, whatever raised and wherever (issue 31).

In process: the worker's app on the tiny model behind aiohttp's test server. Faults are
injected into each surface's writer at each point of a stream (before the first event, after
the opening events, mid-text, in a tool call, at the end); the model's own big-integer tool
call needs no injection at all.
"""

from __future__ import annotations

import asyncio
import json
import re

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from inproc import stop_engine, worker_state

from mlxd.shared.wire.first_token import FIRST_TOKEN
from mlxd.worker.api import anthropic, completions, ollama, openai, responses
from mlxd.worker.app import build_app

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}
BIG = "99999999999999999999"
BIG_CALL = '<tool_call>\\n\\{"name": "add", "arguments": \\{"a": ' + BIG + "\\}\\}\\n</tool_call>"
TEXT = "one two three four five six"
MSG = [{"role": "user", "content": "Add."}]
# A hang fails the test instead of blocking the run (no duration is asserted).
HANG_S = 120


class Boom(RuntimeError):
    pass


@pytest.fixture(scope="module")
def worker(tiny_model_dir):
    """The worker's app on one event loop for the module (the engine's rows and the grammar
    compiler's children belong to the loop that started them)."""
    state = worker_state(tiny_model_dir)
    loop = asyncio.new_event_loop()
    client = TestClient(TestServer(build_app(state), host="127.0.0.1"), loop=loop)
    loop.run_until_complete(client.start_server())
    yield loop, client
    loop.run_until_complete(client.close())
    loop.close()
    stop_engine(state)


def _post(worker, path: str, body: dict) -> tuple[int, bytes]:
    loop, client = worker

    async def go():
        r = await client.post(path, json=body)
        # The supervisor's proxy cuts the worker's first-token marker; here the test does.
        return r.status, (await r.read()).replace(FIRST_TOKEN, b"")

    return loop.run_until_complete(asyncio.wait_for(go(), HANG_S))


def _events(raw: bytes) -> list[tuple[str | None, bytes]]:
    """SSE events as (event name, data); comments dropped."""
    out = []
    for block in raw.split(b"\n\n"):
        lines = [ln for ln in block.split(b"\n") if ln and not ln.startswith(b":")]
        if not lines:
            continue
        name = next((ln[7:].decode() for ln in lines if ln.startswith(b"event: ")), None)
        data = b"".join(ln[6:] for ln in lines if ln.startswith(b"data: "))
        out.append((name, data))
    return out


def _openai_ending(raw: bytes) -> dict:
    events = _events(raw)
    assert events[-1] == (None, b"[DONE]"), raw[-300:]
    return orjson.loads(events[-2][1])["error"]


def _anthropic_ending(raw: bytes) -> dict:
    name, data = _events(raw)[-1]
    assert name == "error", raw[-300:]
    body = orjson.loads(data)
    assert body["type"] == "error"
    return body["error"]


def _responses_ending(raw: bytes) -> dict:
    name, data = _events(raw)[-1]
    assert name == "response.failed", raw[-300:]
    response = orjson.loads(data)["response"]
    assert response["status"] == "failed"
    return response["error"]


def _ollama_ending(raw: bytes) -> dict:
    lines = [orjson.loads(ln) for ln in raw.splitlines() if ln.strip()]
    assert set(lines[-1]) == {"error"}, raw[-300:]
    return lines[-1]


# (path, request body, writer class, how its stream must end, has tool calls)
SURFACES = {
    "chat": (
        "/v1/chat/completions",
        {"messages": MSG, "max_tokens": 64},
        openai.ChatWriter,
        _openai_ending,
        True,
    ),
    "completions": (
        "/v1/completions",
        {"prompt": "Hello", "max_tokens": 64},
        completions.CompletionWriter,
        _openai_ending,
        False,
    ),
    "messages": (
        "/v1/messages",
        {"messages": MSG, "max_tokens": 64},
        anthropic.MessagesWriter,
        _anthropic_ending,
        True,
    ),
    "responses": (
        "/v1/responses",
        {"input": "Add.", "max_output_tokens": 64},
        responses.ResponsesWriter,
        _responses_ending,
        True,
    ),
    "ollama-chat": (
        "/api/chat",
        {"model": "tiny", "messages": MSG, "options": {"num_predict": 64}},
        ollama.ChatWriter,
        _ollama_ending,
        True,
    ),
    "ollama-generate": (
        "/api/generate",
        {"model": "tiny", "prompt": "Hello", "options": {"num_predict": 64}},
        ollama.GenerateWriter,
        _ollama_ending,
        False,
    ),
}
# Where the fault strikes: (writer method, which call of it raises).
POINTS = {
    "before the first event": ("open", 1),
    "after the opening events": ("delta", 1),
    "mid-text": ("delta", 3),
    "in a tool call": ("tool_calls", 1),
    "amid a call's arguments": ("tool_part", 3),
    "at the end": ("done", 1),
}


def _inject(monkeypatch, writer: type, method: str, nth: int) -> list[int]:
    """Make `writer.method` raise on its `nth` call; returns the call counter."""
    real = getattr(writer, method)
    calls = [0]

    def faulty(self, *args):
        calls[0] += 1
        if calls[0] == nth:
            raise Boom("injected")
        return real(self, *args)

    monkeypatch.setattr(writer, method, faulty)
    return calls


TOOL_POINTS = ("in a tool call", "amid a call's arguments")


def _body(surface: str, point: str) -> dict:
    path, body, *_ = SURFACES[surface]
    body = {**body, "stream": True}
    if point in TOOL_POINTS:
        body["tools"] = [ADD]
        body["guided_regex"] = BIG_CALL.replace(BIG, "7")
    else:
        body["guided_regex"] = re.escape(TEXT)
    if surface in ("messages", "responses") and point in TOOL_POINTS:
        body["tools"] = [
            {"name": "add", "input_schema": ADD["function"]["parameters"]}
            if surface == "messages"
            else {"type": "function", "name": "add", "parameters": ADD["function"]["parameters"]}
        ]
    return body


CASES = [
    (surface, point)
    for surface, spec in SURFACES.items()
    for point in POINTS
    if point not in TOOL_POINTS
    or (spec[4] and (point == "in a tool call" or spec[2].streams_tool_args))
]


@pytest.mark.parametrize(("surface", "point"), CASES, ids=[f"{s}-{p}" for s, p in CASES])
def test_a_fault_anywhere_in_a_stream_ends_it_with_the_error_event_and_terminator(
    worker, monkeypatch, surface, point
):
    path, _, writer, ending, _ = SURFACES[surface]
    method, nth = POINTS[point]
    calls = _inject(monkeypatch, writer, method, nth)

    status, raw = _post(worker, path, _body(surface, point))

    assert calls[0] >= nth, f"the fault never struck: {raw[-300:]!r}"
    assert status == 200
    err = ending(raw)
    assert "Internal server error" in str(err)
    assert "Boom" not in raw.decode() and "Traceback" not in raw.decode()


def test_a_writer_whose_error_event_fails_too_still_ends_the_stream(worker, monkeypatch):
    _inject(monkeypatch, responses.ResponsesWriter, "delta", 2)
    _inject(monkeypatch, responses.ResponsesWriter, "error", 1)

    status, raw = _post(worker, "/v1/responses", _body("responses", "mid-text"))

    assert status == 200
    name, data = _events(raw)[-1]
    assert name == "error"
    assert orjson.loads(data)["error"]["type"] == "server_error"


# Greedy, and room enough: the grammar admits many tokenizations of the call, and a sampled
# one of single characters would not fit in 64 tokens.
BIG_BODIES = {
    "chat": ("/v1/chat/completions", {"messages": MSG, "tools": [ADD], "temperature": 0}),
    "messages": (
        "/v1/messages",
        {
            "messages": MSG,
            "max_tokens": 512,
            "temperature": 0,
            "tools": [{"name": "add", "input_schema": ADD["function"]["parameters"]}],
        },
    ),
    "responses": (
        "/v1/responses",
        {
            "input": "Add.",
            "tools": [{"type": "function", "name": "add", **ADD["function"]}],
            "temperature": 0,
        },
    ),
    "ollama-chat": (
        "/api/chat",
        {"model": "tiny", "messages": MSG, "tools": [ADD], "options": {"temperature": 0}},
    ),
}


def _big_call_arguments(surface: str, raw: bytes, stream: bool):
    """The call's arguments as the client receives them."""
    if surface == "ollama-chat":
        lines = [json.loads(ln) for ln in raw.splitlines() if ln.strip()]
        assert lines[-1]["done"] is True
        calls = [c for ln in lines for c in ln["message"].get("tool_calls") or []]
        return calls[0]["function"]["arguments"]
    if not stream:
        body = json.loads(raw)
        if surface == "chat":
            return body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        if surface == "messages":
            return next(b for b in body["content"] if b["type"] == "tool_use")["input"]
        return next(i for i in body["output"] if i["type"] == "function_call")["arguments"]
    events = _events(raw)
    if surface == "chat":
        assert events[-1] == (None, b"[DONE]")
        chunks = [json.loads(d) for _, d in events[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
        deltas = [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls") or []]
        return "".join(d["function"]["arguments"] for d in deltas)  # the call's fragments
    if surface == "messages":
        assert events[-1][0] == "message_stop"
        deltas = [json.loads(d) for n, d in events if n == "content_block_delta"]
        return json.loads("".join(d["delta"].get("partial_json", "") for d in deltas))
    assert events[-1][0] == "response.completed"
    done = [json.loads(d) for n, d in events if n == "response.function_call_arguments.done"]
    return done[0]["arguments"]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("surface", list(BIG_BODIES))
def test_a_tool_call_with_an_integer_beyond_64_bits_keeps_its_digits(worker, surface, stream):
    path, body = BIG_BODIES[surface]
    status, raw = _post(worker, path, {**body, "guided_regex": BIG_CALL, "stream": stream})

    assert status == 200, raw[:300]
    args = _big_call_arguments(surface, raw, stream)
    if isinstance(args, str):  # OpenAI's and the Responses API's arguments are JSON text
        assert args == '{"a":' + BIG + "}"
    else:  # Anthropic's input and Ollama's arguments are objects, with the exact digits
        assert args == {"a": int(BIG)}
    assert BIG.encode() in raw


@pytest.mark.parametrize("surface", list(SURFACES))
def test_a_fault_in_a_whole_body_is_the_surfaces_error_envelope(worker, monkeypatch, surface):
    path, body, writer, _, _ = SURFACES[surface]
    _inject(monkeypatch, writer, "body", 1)

    whole = {**body, "guided_regex": re.escape(TEXT), "stream": False}  # Ollama streams unasked
    status, raw = _post(worker, path, whole)

    assert status == 500
    err = orjson.loads(raw)
    if surface == "messages":
        assert err["type"] == "error" and err["error"]["type"] == "api_error"
    elif surface.startswith("ollama"):
        assert set(err) == {"error"} and err["error"] == "Internal server error"
    else:
        assert err["error"]["type"] == "server_error"
    assert "Boom" not in raw.decode() and "Traceback" not in raw.decode()
