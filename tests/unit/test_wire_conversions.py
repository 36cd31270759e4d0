"""Each API surface converts itself into one ChatJob the worker runs the same way."""

from __future__ import annotations

import pytest

from mlxd.shared.errors import BadRequest
from mlxd.shared.wire.anthropic import MessagesRequest
from mlxd.shared.wire.bodies import parse_model
from mlxd.shared.wire.openai import ChatCompletionRequest
from mlxd.shared.wire.responses import ResponsesRequest

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
}


def test_openai_history_arguments_become_objects_and_tool_choice_is_read():
    req = parse_model(
        ChatCompletionRequest,
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            **CALL,
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            ],
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "response_format": {"type": "json_object"},
            "prompt_cache_key": "s1",
        },
    )
    job = req.to_chat_job()
    assert job.messages[0]["content"] == "Weather?"
    assert job.messages[1]["tool_calls"] == [CALL]
    assert (job.tool_mode, job.forced_tool, job.session) == ("function", "get_weather", "s1")
    assert job.guided.kind == "json_object"
    none = parse_model(
        ChatCompletionRequest,
        {"messages": [{"role": "user", "content": "x"}], "tools": [TOOL], "tool_choice": "none"},
    )
    assert none.to_chat_job().rendered_tools is None


def test_openai_rejects_two_constraints_and_unknown_tool_names():
    with pytest.raises(BadRequest):
        parse_model(
            ChatCompletionRequest,
            {
                "messages": [{"role": "user", "content": "x"}],
                "guided_regex": "a",
                "guided_choice": ["a"],
            },
        )
    req = parse_model(
        ChatCompletionRequest,
        {
            "messages": [{"role": "user", "content": "x"}],
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "nope"}},
        },
    )
    with pytest.raises(BadRequest):
        req.to_chat_job()


def test_anthropic_blocks_become_chat_messages():
    req = parse_model(
        MessagesRequest,
        {
            "max_tokens": 10,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "use the tool", "signature": ""},
                        {
                            "type": "tool_use",
                            "id": "call_1",
                            "name": "get_weather",
                            "input": {"city": "Paris"},
                        },
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"},
                        {"type": "text", "text": "And tomorrow?"},
                    ],
                },
            ],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"},
            "stop_sequences": ["END"],
            "thinking": {"type": "disabled"},
            "metadata": {"user_id": "u1"},
        },
    )
    job = req.to_chat_job()
    assert [m["role"] for m in job.messages] == ["system", "user", "assistant", "tool", "user"]
    assert job.messages[2]["reasoning_content"] == "use the tool"
    assert job.messages[2]["tool_calls"] == [CALL]
    assert job.messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    assert job.tool_mode == "required" and job.params.stop == ("END",)
    assert job.template_kwargs == {"enable_thinking": False} and job.session == "u1"
    with pytest.raises(BadRequest):
        parse_model(MessagesRequest, {"messages": [{"role": "user", "content": "x"}]})


def test_responses_items_become_chat_messages():
    req = parse_model(
        ResponsesRequest,
        {
            "instructions": "Be brief.",
            "tools": [{"type": "function", "name": "get_weather"}],
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city": "Paris"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Sunny."}],
                },
            ],
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        },
    )
    job = req.to_chat_job()
    assert [m["role"] for m in job.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert job.messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert job.guided.kind == "json_schema" and job.guided.param == "text.format"
    assert job.tools[0]["function"]["name"] == "get_weather"


def _bad(cls, body: dict) -> BadRequest:
    with pytest.raises(BadRequest) as err:
        parse_model(cls, body).to_chat_job()
    return err.value


@pytest.mark.parametrize(
    "items, param",
    [
        ([{"role": "user", "content": 5}], "input.0.content"),
        ([{"role": "user", "content": True}], "input.0.content"),
        ([{"role": "system", "content": 1.5}], "input.0.content"),
        ([{"type": "function_call_output", "call_id": "a", "output": 5}], "input.0.output"),
        ([{"type": "custom_tool_call_output", "call_id": "a", "output": 5}], "input.0.output"),
        ([{"type": "reasoning", "summary": 5}], "input.0.summary"),
        ([{"type": "reasoning", "summary": "thought"}], "input.0.summary"),
        ([{"type": "reasoning", "content": [None]}], "input.0.content"),
        ([{"type": "reasoning", "summary": [{"text": "a"}], "content": ["x"]}], "input.0.content"),
        ([{"type": "reasoning", "summary": [{"text": {"a": 1}}]}], "input.0.summary.0.text"),
        ([{"type": "reasoning", "content": [{"text": 5}]}], "input.0.content.0.text"),
    ],
)
def test_responses_items_of_the_wrong_type_are_a_400_naming_the_field(items, param):
    """Found by a black-box probe (2026-12-07): each of these was a 500."""
    err = _bad(ResponsesRequest, {"input": items})
    assert err.param == param and f"Invalid '{param}'" in str(err)


def test_a_responses_reasoning_item_keeps_its_content_then_its_summary():
    item = {"type": "reasoning", "content": [{"text": "a"}], "summary": [{"text": "b"}]}
    body = {"input": [item, {"role": "assistant", "content": "ok"}]}
    job = parse_model(ResponsesRequest, body).to_chat_job()
    assert job.messages == [{"role": "assistant", "content": "ok", "reasoning_content": "ab"}]


@pytest.mark.parametrize("content", [5, {"type": "tool_result"}])
def test_messages_tool_results_of_the_wrong_type_are_a_400(content):
    block = {"type": "tool_result", "tool_use_id": "x", "content": content}
    body = {"max_tokens": 4, "messages": [{"role": "user", "content": [block]}]}
    with pytest.raises(BadRequest) as err:
        parse_model(MessagesRequest, body).to_chat_job()
    assert err.value.param == "messages.0.content.0.content"


@pytest.mark.parametrize("fn", [None, 5, "x", [], [{}]])
def test_a_chat_history_tool_call_without_a_function_object_is_a_400(fn):
    """With tools and a template without a tool format this was a 500 (tool_prompt)."""
    call = {"id": "c1", "type": "function", "function": fn}
    body = {
        "tools": [TOOL],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ],
    }
    err = _bad(ChatCompletionRequest, body)
    assert err.param == "messages.1.tool_calls.0.function"


def test_completions_refuse_echo_with_logprobs():
    from mlxd.shared.wire.completions import CompletionRequest

    err = _bad(CompletionRequest, {"prompt": "hello", "echo": True, "logprobs": 1})
    assert err.param == "logprobs" and "echo" in str(err)
    for ok in ({"echo": True}, {"logprobs": 1}, {"echo": False, "logprobs": 0}):
        assert parse_model(CompletionRequest, {"prompt": "hello", **ok}).to_chat_job()


@pytest.mark.parametrize("text", [None, 1, {"a": 1}, [], True])
def test_a_text_part_whose_text_is_not_a_string_is_a_400_on_every_surface(text):
    """Accepted until 2026-12-07 (its value printed into the prompt)."""
    part = {"type": "text", "text": text}
    hi = [{"role": "user", "content": "hi"}]
    cases = [
        (MessagesRequest, {"max_tokens": 4, "system": [part], "messages": hi}, "system.0.text"),
        (
            MessagesRequest,
            {"max_tokens": 4, "messages": [{"role": "user", "content": [part]}]},
            "messages.0.content.0.text",
        ),
        (
            MessagesRequest,
            {"max_tokens": 4, "messages": [{"role": "assistant", "content": [part]}]},
            "messages.0.content.0.text",
        ),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": [part]}]},
            "messages.0.content.0.text",
        ),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "system", "content": [part]}]},
            "messages.0.content.0.text",
        ),
        (
            ResponsesRequest,
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": text}]}]},
            "input.0.content.0.text",
        ),
    ]
    for cls, body, param in cases:
        assert _bad(cls, body).param == param, (cls.__name__, body)
