"""Tools for chat templates without a tool format, and the stream heartbeat (no MLX)."""

from __future__ import annotations

import orjson

from mlxd.worker.api.sse import Heartbeat
from mlxd.worker.chat.tool_calls import markers, parse_block
from mlxd.worker.chat.tool_prompt import template_renders_tools, with_tools_as_text

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Read",
            "description": "Read a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]

# Shaped like Claude Code's second turn once converted to the chat shape: a call, its result.
CONVERSATION = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "What is in a.txt?"},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "Read", "arguments": '{"path": "a.txt"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "toolu_1", "content": "hello world"},
    {"role": "user", "content": "Summarise it."},
]


class _Tok:
    """A tokenizer whose template ignores `tools` (as SmolLM2's does), counting its renders."""

    has_tool_calling = False
    tool_parser = None

    def __init__(self, renders_tools: bool):
        self.renders_tools = renders_tools
        self.calls = 0

    def apply_chat_template(self, messages, tools=None, **_):
        self.calls += 1
        listed = "".join(t["function"]["name"] for t in tools or []) if self.renders_tools else ""
        return listed + "".join(str(m.get("content")) for m in messages)


def test_the_probe_tells_templates_apart_and_runs_once_per_model():
    plain, tooled = _Tok(False), _Tok(True)
    assert template_renders_tools(plain, "smol") is False
    assert template_renders_tools(tooled, "qwen") is True
    assert template_renders_tools(plain, "smol") is False
    assert plain.calls == 1 and tooled.calls == 1


def test_tools_calls_and_results_become_text_in_the_parsed_format():
    out = with_tools_as_text(CONVERSATION, TOOLS)
    system = out[0]
    assert system["role"] == "system" and system["content"].startswith("You are a coding agent.")
    assert '"name":"Read"' in system["content"] and '"required":["path"]' in system["content"]
    assert "<tool_call>" in system["content"]  # the exact format is spelled out
    assistant = out[2]
    assert "tool_calls" not in assistant
    block = assistant["content"].split("<tool_call>\n", 1)[1].split("\n</tool_call>")[0]
    # What the model is shown is exactly what the worker parses back as a call.
    calls = parse_block(_Tok(False), block, TOOLS, 0)
    assert calls[0].name == "Read" and orjson.loads(calls[0].arguments) == {"path": "a.txt"}
    # The result and the next user text share one user turn (templates refuse two in a row).
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[3]["content"] == "<tool_response>\nhello world\n</tool_response>\nSummarise it."
    assert CONVERSATION[2]["tool_calls"]  # the caller's messages are left alone


def test_a_conversation_without_a_system_message_gets_one():
    out = with_tools_as_text([{"role": "user", "content": "hi"}], TOOLS)
    assert out[0]["role"] == "system" and "# Tools" in out[0]["content"]
    assert out[1] == {"role": "user", "content": "hi"}


def test_fallback_markers_and_a_block_that_is_not_json_stays_text():
    tok = _Tok(False)
    assert markers(tok) == ("<tool_call>", "</tool_call>")
    assert parse_block(tok, "not json", TOOLS, 0) is None


def test_heartbeat_is_due_once_per_quiet_interval():
    now = [0.0]
    beat = Heartbeat(10.0, clock=lambda: now[0])
    now[0] = 5.0
    assert not beat.due()
    now[0] = 9.9  # a keep-alive tick that woke a hair early still counts
    assert beat.due() and not beat.due()  # due resets the interval
    now[0] = 10.0
    now[0] = 15.0
    beat.touch()  # output was written: the quiet interval starts again
    now[0] = 24.0
    assert not beat.due()
    now[0] = 25.0
    assert beat.due()


def test_a_tool_calls_id_is_the_models_only_when_it_is_a_string():
    from types import SimpleNamespace

    from mlxd.worker.chat.tool_calls import parse_block

    plain = SimpleNamespace()  # no native parser: mlx-lm's JSON reading
    for written in ("[1]", "12", '""', "null"):
        (call,) = parse_block(
            plain, f'{{"name": "add", "id": {written}, "arguments": {{}}}}', None, 0
        )
        assert isinstance(call.id, str) and call.id, written
    (kept,) = parse_block(plain, '{"name": "add", "id": "call_7", "arguments": {}}', None, 0)
    assert kept.id == "call_7"


def test_arguments_nested_too_deep_to_write_leave_the_block_as_text():
    from types import SimpleNamespace

    from mlxd.worker.chat.tool_calls import parse_block

    deep = "[" * 300 + "1" + "]" * 300
    assert (
        parse_block(SimpleNamespace(), f'{{"name": "add", "arguments": {{"a": {deep}}}}}', None, 0)
        is None
    )
    shallow = "[" * 20 + "1" + "]" * 20
    (call,) = parse_block(
        SimpleNamespace(), f'{{"name": "add", "arguments": {{"a": {shallow}}}}}', None, 0
    )
    assert call.arguments == '{"a":' + shallow + "}"


def test_a_user_turn_with_images_after_tool_results_keeps_its_images():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": {}}}
    image_turn = [{"type": "image"}, {"type": "text", "text": "see"}]
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "r1"},
        {"role": "user", "content": image_turn},
    ]
    last = with_tools_as_text(msgs, tools)[-1]
    assert last["role"] == "user" and last["content"][-2:] == image_turn
    assert "<tool_response>\nr1\n</tool_response>" in last["content"][0]["text"]
