"""A tool call streams as the model writes it, on each surface, through the official SDKs.

The worker's app runs on the tiny model in a thread of its own (so the synchronous SDK
clients can talk to it over a real socket); a guided_regex makes the random model write a
known call. The SDKs' stream helpers accumulate the fragments: what they build must be the
non-streamed answer. The worker's clock is a fake that the heartbeat tests move on.
"""

from __future__ import annotations

import json
import re

import anthropic
import httpx
import openai
import pytest
from inproc import serving, stop_engine, worker_state

from mlxd.shared.wire.first_token import FIRST_TOKEN

NOTE = "bring an umbrella, a coat and boots"
PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "note": {"type": "string"}},
    "required": ["city", "note"],
}
CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "note": "'
    + NOTE
    + '"}}\n</tool_call>'
)
ARGS = '{"city":"Paris","note":"' + NOTE + '"}'  # what the call's arguments read
# The same call with its arguments as a JSON string: a shape that goes out whole.
STRING_ARGS_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"note\\": '
    '\\"' + NOTE + '\\"}"}\n</tool_call>'
)
MSG = [{"role": "user", "content": "Weather?"}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}]
MESSAGES_TOOLS = [{"name": "get_weather", "input_schema": PARAMS}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "parameters": PARAMS}]
GREEDY = {"temperature": 0}
HEARTBEAT_S = 10.0
HANG_S = 120


class SteppingClock:
    """Fake monotonic time: each reading moves it on by `step_s` (0 holds it still)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.step_s = 0.0

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    """(base URL, clock): the worker's app on 127.0.0.1, its event loop in a thread."""
    clock = SteppingClock()
    state = worker_state(tiny_model_dir, clock, stream_heartbeat_s=HEARTBEAT_S)
    with serving(state, HANG_S) as url:
        yield url, clock
    stop_engine(state)


@pytest.fixture
def clock(served):
    c = served[1]
    c.step_s = 0.0
    yield c
    c.step_s = 0.0


@pytest.fixture
def oai(served):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="x", timeout=HANG_S, max_retries=0)


@pytest.fixture
def claude(served):
    return anthropic.Anthropic(base_url=served[0], api_key="x", timeout=HANG_S, max_retries=0)


def test_chat_completions_stream_the_arguments_in_fragments(oai, clock):
    kw = {"model": "tiny", "messages": MSG, "tools": CHAT_TOOLS, **GREEDY}
    whole = oai.chat.completions.create(**kw, extra_body={"guided_regex": re.escape(CALL)})
    (call,) = whole.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", ARGS)

    kinds, fragments = [], []
    with oai.chat.completions.stream(**kw, extra_body={"guided_regex": re.escape(CALL)}) as s:
        for ev in s:
            kinds.append(ev.type)
            if ev.type == "tool_calls.function.arguments.delta":
                fragments.append(ev.arguments_delta)
            elif ev.type == "chunk" and ev.chunk.choices:
                for d in ev.chunk.choices[0].delta.tool_calls or []:
                    if d.id is not None:  # the call's first delta: id, type and name
                        assert (d.type, d.function.name) == ("function", "get_weather")
                        assert not fragments and not d.function.arguments
        final = s.get_final_completion()
    assert len(fragments) >= 2
    # every fragment came before the call was done, each in a chunk of its own
    done = kinds.index("tool_calls.function.arguments.done")
    assert kinds.count("tool_calls.function.arguments.delta") == len(fragments)
    assert kinds.index("tool_calls.function.arguments.delta") < done
    assert "".join(fragments) == ARGS
    (streamed,) = final.choices[0].message.tool_calls
    assert (streamed.function.name, streamed.function.arguments) == ("get_weather", ARGS)
    assert final.choices[0].finish_reason == "tool_calls"


def test_messages_stream_input_json_deltas_and_the_sdk_builds_the_same_input(claude, clock):
    kw = {
        "model": "tiny",
        "messages": MSG,
        "tools": MESSAGES_TOOLS,
        "max_tokens": 256,
        "extra_body": {"guided_regex": re.escape(CALL), **GREEDY},
    }
    whole = claude.messages.create(**kw)
    (block,) = [b for b in whole.content if b.type == "tool_use"]

    events = []
    with claude.messages.stream(**kw) as s:
        for ev in s:
            events.append(ev)
        final = s.get_final_message()
    kinds = [ev.type for ev in events]
    start = next(
        i
        for i, ev in enumerate(events)
        if ev.type == "content_block_start" and ev.content_block.type == "tool_use"
    )
    opened = events[start].content_block
    assert (opened.name, opened.input) == ("get_weather", {})
    deltas = [i for i, ev in enumerate(events) if ev.type == "input_json"]
    stop = next(i for i in range(start, len(events)) if kinds[i] == "content_block_stop")
    assert len(deltas) >= 2 and start < deltas[0] and deltas[-1] < stop
    assert "".join(events[i].partial_json for i in deltas) == ARGS
    (streamed,) = [b for b in final.content if b.type == "tool_use"]
    assert streamed.input == block.input == json.loads(ARGS)
    assert (streamed.name, final.stop_reason) == ("get_weather", whole.stop_reason)
    assert streamed.id == opened.id


def test_responses_stream_function_call_argument_deltas(oai, clock):
    kw = {
        "model": "tiny",
        "input": "Weather?",
        "tools": RESPONSES_TOOLS,
        **GREEDY,
        "extra_body": {"guided_regex": re.escape(CALL)},
    }
    whole = oai.responses.create(**kw)
    (item,) = [i for i in whole.output if i.type == "function_call"]
    assert item.arguments == ARGS

    with oai.responses.stream(**kw) as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [ev.type for ev in events]
    added = kinds.index("response.output_item.added")
    assert events[added].item.type == "function_call" and events[added].item.arguments == ""
    deltas = [i for i, k in enumerate(kinds) if k == "response.function_call_arguments.delta"]
    done = kinds.index("response.function_call_arguments.done")
    assert len(deltas) >= 2 and added < deltas[0] and deltas[-1] < done
    assert kinds[done + 1] == "response.output_item.done"
    assert "".join(events[i].delta for i in deltas) == events[done].arguments == ARGS
    (streamed,) = [i for i in final.output if i.type == "function_call"]
    assert (streamed.name, streamed.arguments, streamed.status) == (
        "get_weather",
        ARGS,
        "completed",
    )
    assert streamed.call_id == events[added].item.call_id


def _post_lines(served, path: str, body: dict) -> bytes:
    with httpx.Client(base_url=served[0], timeout=HANG_S) as http:
        r = http.post(path, json=body)
    assert r.status_code == 200, r.text[:300]
    return r.content.replace(FIRST_TOKEN, b"")  # the supervisor's proxy cuts the marker


def test_ollama_sends_the_call_whole(served, clock):
    body = {
        "model": "tiny",
        "messages": MSG,
        "tools": CHAT_TOOLS,
        "guided_regex": re.escape(CALL),
        "options": GREEDY,
    }
    lines = [json.loads(ln) for ln in _post_lines(served, "/api/chat", body).splitlines()]
    calls = [c for ln in lines for c in ln["message"].get("tool_calls") or []]
    assert [c["function"]["arguments"] for c in calls] == [json.loads(ARGS)]
    assert lines[-1]["done"] is True


# -- bytes while a call is written: the fake clock moves on 6 s at each reading -------------

SSE_BODIES = {
    "chat": (
        "/v1/chat/completions",
        {"messages": MSG, "tools": CHAT_TOOLS},
        b"get_weather",
    ),
    "messages": (
        "/v1/messages",
        {"messages": MSG, "tools": MESSAGES_TOOLS, "max_tokens": 256},
        b'"type":"tool_use"',
    ),
    "responses": (
        "/v1/responses",
        {"input": "Weather?", "tools": RESPONSES_TOOLS},
        b'"type":"function_call"',
    ),
}
# What a quiet moment sends on each surface (an SSE comment, a ping or a heartbeat event)
QUIET = {
    "chat": [b": keep-alive\n\n"],
    "messages": [b"event: ping\n", b'"stop_reason":null'],
    "responses": [b": keep-alive\n\n", b"event: response.in_progress\n"],
}


@pytest.mark.parametrize("surface", list(SSE_BODIES))
def test_a_call_that_goes_out_whole_does_not_silence_the_stream(served, clock, surface):
    """Arguments written as a JSON string are not streamed: the call waits for its block's
    end, and the stream still gets keep-alives and heartbeats meanwhile."""
    path, body, call_mark = SSE_BODIES[surface]
    clock.step_s = 6.0
    raw = _post_lines(
        served,
        path,
        {**body, "model": "tiny", "stream": True, "guided_regex": re.escape(STRING_ARGS_CALL)},
    )
    before_call = raw[: raw.index(call_mark)]
    quiet = sum(before_call.count(mark) for mark in QUIET[surface])
    assert quiet >= 3, raw[:600]
    assert NOTE.encode() in raw[raw.index(call_mark) :]


def test_ollama_gets_empty_lines_while_the_call_is_written(served, clock):
    clock.step_s = 6.0
    body = {
        "model": "tiny",
        "messages": MSG,
        "tools": CHAT_TOOLS,
        "guided_regex": re.escape(CALL),
        "options": GREEDY,
    }
    lines = [json.loads(ln) for ln in _post_lines(served, "/api/chat", body).splitlines()]
    at = next(i for i, ln in enumerate(lines) if ln["message"].get("tool_calls"))
    beats = lines[:at]
    assert len(beats) >= 2
    assert all(ln["message"]["content"] == "" and not ln["done"] for ln in beats)
    assert lines[at]["message"]["tool_calls"][0]["function"]["arguments"] == json.loads(ARGS)


def test_a_streamed_call_with_heartbeats_still_builds_the_same_message(claude, clock):
    clock.step_s = 6.0
    kw = {
        "model": "tiny",
        "messages": MSG,
        "tools": MESSAGES_TOOLS,
        "max_tokens": 256,
        "extra_body": {"guided_regex": re.escape(CALL), **GREEDY},
    }
    with claude.messages.stream(**kw) as s:
        kinds = [ev.type for ev in s]
        final = s.get_final_message()
    call = kinds[kinds.index("content_block_start") : kinds.index("content_block_stop")]
    assert "message_delta" in call and "input_json" in call  # heartbeats amid the fragments
    (block,) = [b for b in final.content if b.type == "tool_use"]
    assert block.input == json.loads(ARGS)
