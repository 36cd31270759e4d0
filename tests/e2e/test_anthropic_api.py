"""The Anthropic Messages API through a real daemon, driven by the official anthropic SDK.

Where a test needs particular text it forces it with `guided_regex` (an mlxd extension, sent
as extra_body), e.g. `<think>…</think>answer` for thinking blocks.
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest

WEATHER = {
    "name": "get_weather",
    "description": "Current weather",
    "input_schema": {
        "type": "object",
        "required": ["city"],
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
    },
}
MSG = [{"role": "user", "content": "Weather in Paris?"}]


def client_for(d) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=d.url, api_key="sk-test", max_retries=0, timeout=60)


def test_messages_plain_and_streamed(make_daemon):
    client = client_for(make_daemon())
    greedy = {"temperature": 0}  # the current SDK no longer names sampling parameters
    m = client.messages.create(
        model="a",
        max_tokens=8,
        messages=MSG,
        extra_body=greedy,
        system=[{"type": "text", "text": "Be brief."}],
        metadata={"user_id": "u-1"},
    )
    assert m.type == "message" and m.role == "assistant" and m.model == "a"
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 8
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) > 5
    assert m.content[0].type == "text" and m.content[0].text

    with client.messages.stream(
        model="a", max_tokens=8, messages=MSG, extra_body=greedy, system="Be brief."
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == m.content[0].text == final.content[0].text
    assert final.stop_reason == "max_tokens"

    raw = list(client.messages.create(model="a", max_tokens=3, messages=MSG, stream=True))
    kinds = [e.type for e in raw]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert {"content_block_start", "content_block_delta", "content_block_stop"} <= set(kinds)


def test_stop_sequences_and_thinking_blocks(make_daemon):
    client = client_for(make_daemon())
    forced = {"guided_regex": "<think>[a-z]{4,8}</think>It is sunny today"}
    m = client.messages.create(model="a", max_tokens=60, messages=MSG, extra_body=forced)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[1].text == "It is sunny today" and m.stop_reason == "end_turn"
    cut = client.messages.create(
        model="a", max_tokens=60, messages=MSG, extra_body=forced, stop_sequences=["sunny"]
    )
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == "sunny"
    assert cut.content[-1].text == "It is"
    events = list(
        client.messages.create(
            model="a", max_tokens=60, messages=MSG, extra_body=forced, stream=True
        )
    )
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert deltas[0] == "thinking_delta" and deltas[-1] == "text_delta"


def test_tools_tool_use_and_tool_result(make_daemon):
    client = client_for(make_daemon())
    m = client.messages.create(
        model="a",
        max_tokens=200,
        messages=MSG,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert m.stop_reason == "tool_use"
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER["input_schema"])

    with client.messages.stream(
        model="a", max_tokens=200, messages=MSG, tools=[WEATHER], tool_choice={"type": "any"}
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content][-1] == "tool_use"

    history = MSG + [
        {"role": "assistant", "content": m.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
        },
    ]
    answer = client.messages.create(
        model="a",
        max_tokens=60,
        messages=history,
        tools=[WEATHER],
        extra_body={"guided_regex": "Sunny in Paris"},
    )
    assert answer.content[0].text == "Sunny in Paris" and answer.stop_reason == "end_turn"


def test_output_config_json_schema(make_daemon):
    client = client_for(make_daemon())
    schema = {
        "type": "object",
        "required": ["city"],
        "additionalProperties": False,
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
    }
    m = client.messages.create(
        model="a",
        max_tokens=100,
        messages=MSG,
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    jsonschema.validate(json.loads(m.content[0].text), schema)


def test_count_tokens_and_error_envelope(make_daemon):
    client = client_for(make_daemon())
    plain = client.messages.count_tokens(model="a", messages=MSG)
    with_tools = client.messages.count_tokens(model="a", messages=MSG, tools=[WEATHER])
    assert 5 < plain.input_tokens < with_tools.input_tokens

    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="a", max_tokens=0, messages=MSG)
    assert err.value.body["type"] == "error"
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in err.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="no-such-model", max_tokens=5, messages=MSG)
    assert err.value.body["error"]["type"] == "not_found_error"
