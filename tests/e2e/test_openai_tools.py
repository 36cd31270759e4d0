"""Chat tool calls and structured output through a real daemon, with the official openai SDK.

The tiny model is random, so the tests force what it says: a guided_regex that spells out the
template's tool-call text, or tool_choice (enforced by a grammar). Parsing and the wire shapes
are what is under test.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
        },
    },
}
PARIS_CALL = re.escape(
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
MSG = [{"role": "user", "content": "Weather in Paris?"}]


def test_chat_tool_calls_plain_streamed_and_round_trip(make_daemon):
    client = make_daemon().openai()
    r = client.chat.completions.create(
        model="a", messages=MSG, tools=[WEATHER], extra_body={"guided_regex": PARIS_CALL}
    )
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    stream = client.chat.completions.create(
        model="a",
        messages=MSG,
        tools=[WEATHER],
        stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    chunks = list(stream)
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    # id and name first, then the arguments in the fragments the model wrote them in
    assert {d.index for d in deltas} == {0} and deltas[0].id.startswith("call_")
    assert len(deltas) >= 2 and all(d.id is None for d in deltas[1:])
    arguments = "".join(d.function.arguments for d in deltas)
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    history = MSG + [
        r.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24C"},
    ]
    answer = client.chat.completions.create(
        model="a", messages=history, tools=[WEATHER], extra_body={"guided_regex": "Sunny and 24C"}
    )
    assert answer.choices[0].message.content == "Sunny and 24C"
    assert answer.choices[0].finish_reason == "stop"


def test_json_schema_for_concurrent_requests(make_daemon):
    client = make_daemon().openai()
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["ok", "tag"],
        "properties": {"ok": {"type": "boolean"}, "tag": {"type": "string", "maxLength": 6}},
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}}

    def one(i: int) -> str:
        r = client.chat.completions.create(
            model="a",
            messages=[{"role": "user", "content": f"item {i}"}],
            max_tokens=200,
            temperature=1.0,
            seed=i,
            response_format=fmt,
        )
        assert r.choices[0].finish_reason == "stop"
        return r.choices[0].message.content

    with ThreadPoolExecutor(5) as pool:
        for text in pool.map(one, range(5)):
            jsonschema.validate(json.loads(text), schema)
