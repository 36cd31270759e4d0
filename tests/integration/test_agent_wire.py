"""Coding agents' real request shapes (issue 12): Claude Code on /v1/messages, Codex on
/v1/responses (bodies in tests/agent_bodies.py), and the rules they rely on, without a model
or a process.
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import jinja2
import orjson
import pytest
from agent_bodies import APPLY_PATCH_GRAMMAR, CLAUDE_CODE_BODY, CODEX_BODY, REMINDER
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from mlxd.shared.chat_job import ChatJob, fold_system_messages, late_system_indexes
from mlxd.shared.config import Settings
from mlxd.shared.errors import BadRequest
from mlxd.shared.middleware import error_middleware
from mlxd.shared.params import GenerationParams
from mlxd.shared.wire.anthropic import MessagesRequest
from mlxd.shared.wire.bodies import parse_model
from mlxd.shared.wire.openai import ChatCompletionRequest
from mlxd.shared.wire.responses import ResponsesRequest
from mlxd.shared.wire.responses_out import FunctionCallItem
from mlxd.shared.wire.tools import CUSTOM_INPUT, chat_tool_set, qualified_name
from mlxd.supervisor.http import routes
from mlxd.supervisor.http.auth import auth_middleware
from mlxd.supervisor.http.cors import cors_middleware
from mlxd.supervisor.http.guard import guard_middleware
from mlxd.worker.api.openai import _tool_call
from mlxd.worker.api.responses import _call_item
from mlxd.worker.app import access_log
from mlxd.worker.chat.events import RowProgress
from mlxd.worker.chat.prompts import fit_max_tokens, render_job
from mlxd.worker.chat.tool_calls import ToolCall


# -- Claude Code --------------------------------------------------------------------------
def test_claude_code_body_is_accepted_with_its_mid_conversation_system_message():
    req = parse_model(MessagesRequest, orjson.loads(orjson.dumps(CLAUDE_CODE_BODY)))
    job = req.to_chat_job()
    roles = [m["role"] for m in job.messages]
    assert roles == ["system", "user", "system", "assistant", "tool"]
    assert job.messages[2]["content"] == REMINDER  # in place, its text kept
    assert job.messages[0]["content"].startswith("You are Claude Code")
    assert job.params.max_tokens == 32000 and job.surface == "anthropic"
    assert job.template_kwargs == {"enable_thinking": True}
    assert job.session == "user_abc_account__session_1234"
    assert [t["function"]["name"] for t in job.tools] == ["Bash", "Read"]
    assert job.messages[3]["tool_calls"][0]["function"]["arguments"] == {
        "command": "ls",
        "description": "List files",
    }


def test_a_system_message_with_text_blocks_mid_conversation_is_accepted():
    body = {
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "system",
                "content": [
                    {"type": "text", "text": REMINDER, "cache_control": {"type": "ephemeral"}}
                ],
            },
            {"role": "user", "content": "go on"},
        ],
    }
    job = parse_model(MessagesRequest, body).to_chat_job()
    assert job.messages[1] == {"role": "system", "content": REMINDER}


def test_a_role_other_than_user_assistant_system_is_still_a_400():
    with pytest.raises(BadRequest) as e:
        parse_model(
            MessagesRequest, {"max_tokens": 4, "messages": [{"role": "robot", "content": "hi"}]}
        )
    assert e.value.param == "messages.0.role"


# -- folding system messages for templates that refuse them ----------------------------------
def test_late_system_messages_fold_into_the_next_user_turn_or_else_the_previous_one():
    msgs = [
        {"role": "system", "content": "S0"},
        {"role": "system", "content": "S1"},
        {"role": "user", "content": "U1"},
        {"role": "system", "content": "mid"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "U2"},
        {"role": "system", "content": "tail"},
    ]
    assert late_system_indexes(msgs) == [3, 6]
    out = fold_system_messages(msgs)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"] == "S0\n\nS1"
    assert out[1]["content"] == "U1"
    assert out[3]["content"] == (
        "<system_note>\nmid\n</system_note>\n\nU2\n\n<system_note>\ntail\n</system_note>"
    )
    assert msgs[5]["content"] == "U2"  # the request's own list is left as it was


def test_a_system_message_with_no_user_turn_anywhere_becomes_one():
    out = fold_system_messages(
        [{"role": "assistant", "content": "A"}, {"role": "system", "content": "note"}]
    )
    assert out[-1] == {"role": "user", "content": "<system_note>\nnote\n</system_note>"}


_RENDER_IN_PLACE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"
)
_RAISES = (
    "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
    "<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"
)
_DROPS = (
    "{% for m in messages %}{% if m.role != 'system' or loop.first %}"
    "<|{{ m.role }}|>{{ m.content }}\n{% endif %}{% endfor %}<|assistant|>"
)


class _Tokenizer:
    """Just enough of a tokenizer for chat_prompt: a jinja template and a word count."""

    has_thinking = False

    def __init__(self, template: str):
        self._t = jinja2.Environment().from_string(template)

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, **kwargs):
        def raise_exception(msg):
            raise jinja2.TemplateError(msg)

        return self._t.render(messages=messages, raise_exception=raise_exception, **kwargs)

    def encode(self, text, add_special_tokens=False):
        return list(range(len(text.split())))


def _model(template: str):
    return SimpleNamespace(tokenizer=_Tokenizer(template), context_limit=4096, max_token_bytes=16)


def _job() -> ChatJob:
    return parse_model(
        MessagesRequest,
        {
            "max_tokens": 10,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": REMINDER},
                {"role": "user", "content": "go on"},
            ],
        },
    ).to_chat_job()


def test_a_template_that_renders_system_messages_anywhere_keeps_them_in_place():
    prompt = render_job(_model(_RENDER_IN_PLACE), job := _job(), None)
    assert f"<|system|>{REMINDER}" in prompt.text and "system_note" not in prompt.text
    assert [m["role"] for m in job.messages] == ["user", "system", "user"]


@pytest.mark.parametrize("template", [_RAISES, _DROPS], ids=["raises", "drops"])
def test_a_template_that_refuses_or_drops_them_gets_a_note_in_the_user_turn(template):
    prompt = render_job(_model(template), _job(), None)
    assert f"<|user|><system_note>\n{REMINDER}\n</system_note>\n\ngo on" in prompt.text


# -- the context rule -----------------------------------------------------------------------
def test_max_tokens_is_clamped_to_the_room_the_prompt_leaves():
    assert fit_max_tokens(8192, 158, 32000) == 8192 - 158
    assert fit_max_tokens(8192, 158, 100) == 100
    assert fit_max_tokens(8192, 158, None) == 8192 - 158
    assert fit_max_tokens(512, 511, 32000, "anthropic") == 1


def test_a_prompt_that_fills_the_context_is_refused_in_anthropic_wording_on_messages():
    with pytest.raises(BadRequest) as e:
        fit_max_tokens(8192, 8192, 32000, "anthropic")
    assert e.value.message == (
        "input length and `max_tokens` exceed context limit: "
        "8192 + 32000 > 8192, decrease input length or `max_tokens` "
        "and try again"
    )
    with pytest.raises(BadRequest) as e:
        fit_max_tokens(8192, 9000, 32000)
    assert e.value.code == "context_length_exceeded" and "9000 tokens" in e.value.message


# -- Codex ----------------------------------------------------------------------------------
def test_codex_body_is_accepted_with_namespaces_flattened_and_hosted_tools_dropped():
    req = parse_model(ResponsesRequest, orjson.loads(orjson.dumps(CODEX_BODY)))
    job = req.to_chat_job()
    names = [t["function"]["name"] for t in job.tools]
    assert names == ["exec_command", "mcp__docs__search", "apply_patch"]
    patch = job.tools[2]["function"]
    assert patch["parameters"]["required"] == [CUSTOM_INPUT]
    assert APPLY_PATCH_GRAMMAR in patch["description"]
    assert job.tool_origins["mcp__docs__search"].namespace == "mcp__docs__"
    assert job.tool_origins["apply_patch"].custom
    warning = job.warnings[0]
    assert warning.startswith('299 mlxd "') and "web_search, image_generation" in warning
    assert job.session == "0199c3f1-session"


def test_codex_history_renders_as_the_model_saw_its_tools():
    job = parse_model(ResponsesRequest, CODEX_BODY).to_chat_job()
    msgs = job.messages
    assert [m["role"] for m in msgs] == [
        "system",
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "system",
    ]
    assert msgs[3]["reasoning_content"] == "Look at the tests."
    assert msgs[5]["tool_calls"][0]["function"]["name"] == "mcp__docs__search"
    assert msgs[7]["tool_calls"][0]["function"]["arguments"] == {
        CUSTOM_INPUT: "*** Begin Patch\n*** End Patch\n"
    }
    assert msgs[8]["content"] == "Done!"
    assert msgs[9]["content"] == "Approval mode changed to never."


def test_calls_go_back_to_codex_with_their_namespace_or_as_custom_tool_calls():
    job = parse_model(ResponsesRequest, CODEX_BODY).to_chat_job()
    ns = _call_item(ToolCall("call_9", "mcp__docs__search", '{"q": "x"}'), job)
    assert ns.model_dump() == {
        "type": "function_call",
        "id": ns.id,
        "call_id": "call_9",
        "name": "search",
        "namespace": "mcp__docs__",
        "arguments": '{"q": "x"}',
        "status": "completed",
    }
    patch = _call_item(ToolCall("call_10", "apply_patch", '{"input": "*** Begin Patch\\n"}'), job)
    assert patch.model_dump()["type"] == "custom_tool_call"
    assert patch.input == "*** Begin Patch\n"
    plain = _call_item(ToolCall("call_11", "exec_command", "{}"), job)
    assert "namespace" not in plain.model_dump()
    assert (
        FunctionCallItem(id="fc", call_id="c", name="n", arguments="{}")
        .model_dump()
        .get("namespace", "absent")
        == "absent"
    )


def test_chat_completions_accept_the_same_tool_kinds():
    tools = [
        {"type": "function", "function": {"name": "shell", "parameters": {}}},
        {
            "type": "namespace",
            "name": "mcp__fs",
            "tools": [{"type": "function", "function": {"name": "read"}}],
        },
        {"type": "custom", "custom": {"name": "apply_patch", "description": "edit"}},
        {"type": "local_shell"},
        {"type": "web_search_preview"},
    ]
    req = parse_model(
        ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}], "tools": tools}
    )
    job = req.to_chat_job()
    assert [t["function"]["name"] for t in job.tools] == ["shell", "mcp__fs__read", "apply_patch"]
    assert "local_shell, web_search_preview" in job.warnings[0]
    call = _tool_call(ToolCall("c1", "apply_patch", '{"input": "diff"}'), job)
    assert call == {
        "id": "c1",
        "type": "custom",
        "custom": {"name": "apply_patch", "input": "diff"},
    }
    assert qualified_name("mcp__fs", "read") == "mcp__fs__read"


def test_a_custom_tool_call_in_chat_history_renders_as_its_function_call():
    msgs = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "custom", "custom": {"name": "apply_patch", "input": "diff"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    job = parse_model(ChatCompletionRequest, {"messages": msgs}).to_chat_job()
    assert job.messages[1]["tool_calls"][0]["function"] == {
        "name": "apply_patch",
        "arguments": {CUSTOM_INPUT: "diff"},
    }


@pytest.mark.parametrize(
    "tools,param",
    [
        ([{"type": "function", "function": {"description": "no name"}}], "tools.0.function"),
        ([{"type": "function"}], "tools.0"),
        ([{"type": "namespace", "name": "ns", "tools": "nope"}], "tools.0"),
        (["not an object"], "tools.0"),
    ],
)
def test_a_malformed_function_tool_is_still_a_400_naming_it(tools, param):
    with pytest.raises(BadRequest) as e:
        chat_tool_set(tools)
    assert e.value.param == param


# -- small things ---------------------------------------------------------------------------
def test_head_slash_is_200_with_no_body_and_get_slash_answers_like_ollama():
    async def go():
        # The daemon's middlewares, with an API key set: the probe needs none.
        app = web.Application(
            middlewares=[error_middleware, guard_middleware, cors_middleware, auth_middleware]
        )
        app["settings"] = Settings(host="127.0.0.1", port=8080, api_key="secret")
        routes.add_routes(app)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            head = await client.head("/", headers={"Host": "localhost:8080"})
            body = await head.read()
            get = await client.get("/", headers={"Host": "localhost:8080"})
            return head.status, body, get.status, await get.text()

    # Ollama clients probe GET / for this text (issue 17); it used to be a 404.
    head, body, get, text = asyncio.run(go())
    assert (head, body, get, text) == (200, b"", 200, "Ollama is running")


def test_a_cancelled_request_leaves_a_499_line_with_its_progress(caplog):
    request = make_mocked_request("POST", "/v1/messages")
    request["request_id"] = "req-1"
    # 200 tokens came from the cache and 1000 more were prefilled when the client left.
    gen = SimpleNamespace(prompt_tokens=5000, cached_tokens=200, prompt_done=1200)

    async def handler(req):
        req["progress"] = RowProgress(gen=gen, completion_tokens=0)
        raise asyncio.CancelledError

    with caplog.at_level(logging.INFO, logger="mlxd.worker"), pytest.raises(asyncio.CancelledError):
        asyncio.run(access_log(request, handler))
    line = caplog.records[-1].getMessage()
    assert "POST /v1/messages 499" in line and "request_id=req-1" in line
    assert "prompt_tokens=5000 prompt_done=1200 completion_tokens=0" in line


def test_generation_params_keep_the_requested_budget_until_the_worker_clamps_it():
    req = parse_model(MessagesRequest, CLAUDE_CODE_BODY)
    assert req.to_generation_params() == GenerationParams(
        max_tokens=32000, temperature=1, stop=(), reasoning_budget=31999
    )


def test_a_developer_message_mid_chat_is_a_system_message_for_the_template():
    req = parse_model(
        ChatCompletionRequest,
        {
            "messages": [
                {"role": "developer", "content": "Be terse."},
                {"role": "user", "content": "hi"},
                {"role": "developer", "content": [{"type": "text", "text": "Mode: plan."}]},
                {"role": "user", "content": "go"},
            ]
        },
    )
    msgs = req.to_chat_job().messages
    assert [m["role"] for m in msgs] == ["system", "user", "system", "user"]
    assert late_system_indexes(msgs) == [2]
    assert fold_system_messages(msgs)[-1]["content"].startswith(
        "<system_note>\nMode: plan.\n</system_note>"
    )


def test_the_warning_names_odd_tool_types_safely_in_a_header():
    warning = chat_tool_set([{"type": 'we"b\nsé'}]).warning
    assert warning.isascii() and "\n" not in warning and warning.count('"') == 2


def test_system_blocks_stay_separate_paragraphs():
    # Claude Code sends its system prompt as several text blocks; glued together, the end of
    # one sentence would run into the next ("…for Claude.You are…").
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        "system": [
            {"type": "text", "text": "First block."},
            {"type": "text", "text": "Second block."},
        ],
    }
    system = parse_model(MessagesRequest, body).chat_messages()[0]
    assert system == {"role": "system", "content": "First block.\n\nSecond block."}
