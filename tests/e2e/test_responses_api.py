"""The Responses API through a real daemon with the openai SDK: create, stream, function calls,
and conversations continued by previous_response_id from the supervisor's store.

Text is forced with `guided_regex` (an mlxd extension) where a test needs to know it.
"""

from __future__ import annotations

import json
import re

import openai
import pytest

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris"]}},
        "required": ["city"],
    },
}
PARIS_CALL = re.escape(
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def test_create_get_delete_and_unknown_previous_id(make_daemon):
    d = make_daemon()
    client = d.openai()
    r = client.responses.create(
        model="a",
        input="Say hello.",
        instructions="Be brief.",
        extra_body={"guided_regex": "Hello there"},
    )
    assert r.id.startswith("resp_") and r.status == "completed"
    assert r.output_text == "Hello there" and r.instructions == "Be brief."
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert client.responses.retrieve(r.id).output_text == "Hello there"
    items = d.http.get(f"/v1/responses/{r.id}/input_items").json()["data"]
    assert items == [{"type": "message", "role": "user", "content": "Say hello."}]
    limited = client.responses.create(model="a", input="Go on.", max_output_tokens=3)
    assert limited.status == "incomplete"
    assert limited.incomplete_details.reason == "max_output_tokens"
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.retrieve(r.id)
    assert err.value.body["type"] == "not_found_error"
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model="a", input="Hi", previous_response_id="resp_missing")
    assert err.value.body["param"] == "previous_response_id"


def test_stream_event_sequence_and_stored_result(make_daemon):
    client = make_daemon().openai()
    events = list(
        client.responses.create(
            model="a", input="Greet me.", stream=True, extra_body={"guided_regex": "Hello, friend"}
        )
    )
    kinds = [e.type for e in events]
    assert [k for i, k in enumerate(kinds) if k not in kinds[:i]] == EVENTS
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == "Hello, friend" == final.output_text
    assert client.responses.retrieve(final.id).output_text == "Hello, friend"
    with client.responses.stream(
        model="a", input="Again.", extra_body={"guided_regex": "Hi"}
    ) as stream:
        assert stream.get_final_response().output_text == "Hi"


def test_function_call_then_output_with_previous_response_id(make_daemon):
    client = make_daemon().openai()
    events = list(
        client.responses.create(
            model="a",
            input="Weather in Paris?",
            stream=True,
            tools=[WEATHER],
            extra_body={"guided_regex": PARIS_CALL},
        )
    )
    kinds = [e.type for e in events]
    for k in (
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ):
        assert k in kinds
    first = events[-1].response
    (call,) = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    follow = client.responses.create(
        model="a",
        previous_response_id=first.id,
        tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        extra_body={"guided_regex": "It is sunny"},
    )
    assert follow.output_text == "It is sunny"
    assert follow.previous_response_id == first.id


def test_conversation_survives_the_worker_being_unloaded(make_daemon):
    d = make_daemon(config="keep_alive_s = 0\n")
    client = d.openai()
    first = client.responses.create(
        model="a", input="My name is Ada.", extra_body={"guided_regex": "Nice to meet you, Ada"}
    )
    d.wait_for(
        lambda: d.status("a")["status"] == "available" and not d.worker_pids("a"),
        what="the worker to unload after its response",
    )
    second = client.responses.create(
        model="a",
        input="What is my name?",
        previous_response_id=first.id,
        extra_body={"guided_regex": "Ada"},
    )
    assert second.output_text == "Ada"
    items = d.http.get(f"/v1/responses/{second.id}/input_items").json()["data"]
    assert items[0]["content"] == "My name is Ada."
    assert items[1]["type"] == "message" and items[1]["role"] == "assistant"
    assert items[1]["content"][0]["text"] == "Nice to meet you, Ada"
    assert items[2]["content"] == "What is my name?"


def test_a_chain_grown_past_the_body_limit_is_a_413_naming_it(make_daemon):
    """Each request is under max_body_bytes, but the conversation the supervisor rebuilds from
    previous_response_id is not: a clear 413 in OpenAI's envelope, and the chain's first
    response is still there to branch from."""
    d = make_daemon(config="max_body_bytes = 4096\n")
    client = d.openai()
    words = " ".join(["word"] * 500)  # ~2.5 kB a turn
    first = client.responses.create(model="a", input=words, extra_body={"guided_regex": "Noted"})
    with pytest.raises(openai.APIStatusError) as err:
        client.responses.create(
            model="a",
            input=words,
            previous_response_id=first.id,
            extra_body={"guided_regex": "Noted"},
        )
    assert err.value.status_code == 413
    body = err.value.body
    assert body["param"] == "previous_response_id", body
    assert "max_body_bytes" in body["message"] and "4096" in body["message"], body
    assert client.responses.retrieve(first.id).output_text == "Noted"
