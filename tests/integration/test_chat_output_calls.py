"""A chat's tool calls as the engine's text comes (worker/chat/events.py's ChatOutput): a call's
start and argument fragments while it is written, the whole call at its block's end, and the
same calls whether the text came in one piece or one character at a time (no MLX runs)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mlxd.shared.chat_job import ChatJob
from mlxd.shared.params import GenerationParams
from mlxd.shared.wire.tools import ToolOrigin
from mlxd.worker.chat.events import (
    ChatOutput,
    Delta,
    ToolCallArgs,
    ToolCallCut,
    ToolCalls,
    ToolCallStart,
)
from mlxd.worker.engine.rows import Event

# A tokenizer without a tool parser: the JSON-in-tags format tool_prompt.py asks for.
TOK = SimpleNamespace(has_thinking=False, has_tool_calling=False, tool_parser=None)
TOOLS = [{"type": "function", "function": {"name": n}} for n in ("get_weather", "apply_patch")]
CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n'
    "</tool_call>"
)
ARGS = '{"city":"Paris","days":[1,2]}'


def feed(text: str, size: int, finish: str = "stop", custom: bool = False) -> tuple[list, str]:
    origins = {"apply_patch": ToolOrigin("apply_patch", custom=True)} if custom else {}
    job = ChatJob(messages=[], params=GenerationParams(), tools=TOOLS, tool_origins=origins)
    out = ChatOutput(TOK, job, in_reasoning=False, stops=())
    pieces = [text[i : i + size] for i in range(0, len(text), size)] or [""]
    items = []
    for n, piece in enumerate(pieces):
        last = n == len(pieces) - 1
        got, _ = out.feed(Event(piece, n + 1, finish if last else None))
        items += got
    return items, out.done(finish, len(pieces)).finish_reason


def calls(items: list) -> list:
    return [c for i in items if isinstance(i, ToolCalls) for c in i.calls]


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_a_call_starts_then_streams_arguments_that_join_to_the_whole_call(size):
    items, finish = feed("Let me look. " + CALL + "\n" + CALL, size)
    starts = [i for i in items if isinstance(i, ToolCallStart)]
    assert [(s.index, s.name) for s in starts] == [(0, "get_weather"), (1, "get_weather")]
    for start, call in zip(starts, calls(items), strict=True):
        fragments = [
            i.text for i in items if isinstance(i, ToolCallArgs) and i.index == start.index
        ]
        assert "".join(fragments) == call.arguments == ARGS
        assert (call.id, call.index, call.streamed) == (start.id, start.index, True)
        # the start comes before its fragments, the whole call after them
        at = items.index(start)
        assert all(
            items.index(i) > at
            for i in items
            if isinstance(i, ToolCallArgs) and i.index == start.index
        )
    if size == 1:
        assert sum(isinstance(i, ToolCallArgs) for i in items) > 10
    assert finish == "tool_calls"
    assert "".join(i.text for i in items if isinstance(i, Delta)) == "Let me look."


def test_the_calls_are_the_same_in_one_piece_or_character_by_character():
    whole, _ = feed(CALL, 1000)
    chars, _ = feed(CALL, 1)
    assert [(c.name, c.arguments, c.index) for c in calls(whole)] == [
        (c.name, c.arguments, c.index) for c in calls(chars)
    ]


def test_a_call_cut_short_is_cut_and_its_text_stays_text():
    text = CALL[: CALL.index("Paris")]
    items, finish = feed(text, 3, finish="length")
    kinds = [type(i) for i in items]
    assert kinds[0] is ToolCallStart and ToolCallCut in kinds
    assert kinds.index(ToolCallCut) > kinds.index(ToolCallArgs)
    assert not calls(items) and finish == "length"
    assert "".join(i.text for i in items if isinstance(i, Delta)) == text


def test_a_block_that_does_not_parse_after_it_started_is_cut_and_kept_as_text():
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}, oops}\n</tool_call>'
    items, finish = feed(bad, 4)
    assert isinstance(items[0], ToolCallStart) and any(isinstance(i, ToolCallCut) for i in items)
    assert not calls(items) and finish == "stop"
    assert "".join(i.text for i in items if isinstance(i, Delta)) == bad


@pytest.mark.parametrize(
    ("block", "custom"),
    [
        (
            '<tool_call>\n[{"name": "get_weather", "arguments": {"city": "Rome"}}]\n</tool_call>',
            False,
        ),
        ('<tool_call>\n{"name": "apply_patch", "arguments": {"input": "x"}}\n</tool_call>', True),
    ],
    ids=["a list of calls", "a custom tool"],
)
def test_a_call_that_does_not_stream_comes_whole(block, custom):
    items, finish = feed(block, 2, custom=custom)
    assert not any(isinstance(i, ToolCallStart | ToolCallArgs) for i in items)
    (call,) = calls(items)
    assert not call.streamed and finish == "tool_calls"
