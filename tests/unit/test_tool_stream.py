"""A tool call read as it is written (worker/chat/tool_stream.py): the name once known, then
the arguments' text in fragments that join to exactly the finished call's arguments."""

from __future__ import annotations

import json

import pytest

from mlxd.shared.wire.safe_json import dumps, loads_exact
from mlxd.worker.chat.tool_stream import FAIL, NEED, CallStream, match_head

BLOCKS = {
    "plain": '\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n',
    "nested": '{"name":"f","arguments":{"a":{"b":[{"c":null}, true, -1.5e3]},"d":"}]{["}}',
    "escapes": '{"name": "w\\"x", "arguments": {"p": "a\\\\b\\"c\\n\\u00e9 \\ud83d\\ude00"}}',
    "spaces in strings": '{"name": "f", "arguments": { "text" : "  two  spaces\\t" }}',
    "big integer": '{"name": "add", "arguments": {"a": 99999999999999999999}}',
    "empty": '{"name": "now", "arguments": {}}',
}


def run(pieces: list[str]) -> tuple[str | None, list[str], CallStream]:
    call = CallStream()
    name, fragments = None, []
    for piece in pieces:
        for kind, value in call.feed(piece):
            if kind == "name":
                assert name is None and not fragments  # the name comes once, first
                name = value
            else:
                fragments.append(value)
    return name, fragments, call


def parsed_arguments(block: str) -> str:
    """What parse_block makes of the block's arguments (the non-streamed value)."""
    return dumps(loads_exact(block)["arguments"]).decode()


@pytest.mark.parametrize("block", BLOCKS.values(), ids=BLOCKS.keys())
def test_every_split_point_gives_the_same_name_and_arguments(block):
    whole_name, whole, call = run([block])
    assert call.args.complete
    assert whole_name == json.loads(block)["name"]
    joined = "".join(whole)
    for i in range(len(block) + 1):
        name, fragments, _ = run([block[:i], block[i:]])
        assert (name, "".join(fragments)) == (whole_name, joined), i
    name, fragments, _ = run(list(block))  # one character at a time
    assert (name, "".join(fragments)) == (whole_name, joined)


@pytest.mark.parametrize("block", BLOCKS.values(), ids=BLOCKS.keys())
def test_the_joined_fragments_are_the_final_arguments_and_read_as_the_same_value(block):
    _, fragments, call = run(list(block))
    joined = "".join(fragments)
    assert call.final_arguments(parsed_arguments(block)) == joined
    assert loads_exact(joined) == loads_exact(block)["arguments"]


def test_arguments_stream_in_many_fragments_before_the_call_ends():
    block = BLOCKS["plain"]
    _, fragments, _ = run(list(block))
    assert len(fragments) > 10
    assert "".join(fragments) == '{"city":"Paris","days":[1,2]}'  # compact, as orjson writes


def test_the_compact_text_is_what_orjson_writes_for_plain_arguments():
    # the non-streamed answer is unchanged for what models usually write (a number keeps
    # the model's spelling: "nested" has -1.5e3, which orjson writes -1500.0)
    for key in ("plain", "empty", "big integer"):
        _, fragments, _ = run([BLOCKS[key]])
        assert "".join(fragments) == parsed_arguments(BLOCKS[key]), key


@pytest.mark.parametrize(
    ("written", "plain"),
    [
        ('{"x": NaN, "y": -Infinity, "z": Infinity}', '{"x":null,"y":null,"z":null}'),
        ('{"x": 1e400}', '{"x":null}'),
        ('{"s": "a\\ud800b"}', '{"s":"a\\ufffdb"}'),  # a lone high surrogate
        ('{"s": "\\udc00"}', '{"s":"\\ufffd"}'),  # a lone low one
        ('{"s": "\\ud800\\ud800\\udc00"}', '{"s":"\\ufffd\\ud800\\udc00"}'),
    ],
)
def test_values_a_parser_reads_differently_stream_as_safe_json_writes_them(written, plain):
    block = '{"name": "f", "arguments": ' + written + "}"
    for i in range(len(block) + 1):
        _, fragments, call = run([block[:i], block[i:]])
        assert "".join(fragments) == plain, i
    assert call.final_arguments(parsed_arguments(block)) == plain
    assert dumps(loads_exact(plain)) == dumps(loads_exact(written))


@pytest.mark.parametrize(
    "block",
    [
        '[{"name": "f", "arguments": {}}]',  # a list of calls
        '{"arguments": {}, "name": "f"}',  # arguments first
        '{"name": "f", "arguments": "{\\"a\\": 1}"}',  # arguments as a string
        '{"name": "f", "id": "c1", "arguments": {}}',  # another key before them
        '<function=f>{"a": 1}</function>',  # another format
    ],
)
def test_other_shapes_are_held_for_the_whole_block(block):
    for i in range(len(block) + 1):
        name, fragments, call = run([block[:i], block[i:]])
        assert (name, fragments, call.held) == (None, [], True), i


def test_a_head_is_waited_for_only_while_it_could_still_match():
    assert match_head('  {"na') == NEED
    assert match_head('{"name": "get_') == NEED
    assert match_head('{"name": "f", "argu') == NEED
    assert match_head('{"name": "f", "args"') == FAIL
    assert match_head('{"name": 3') == FAIL
    text = '{"name": "f", "arguments": {'
    assert match_head(text) == (len(text) - 1, "f")


def test_a_name_the_caller_does_not_stream_is_held():
    call = CallStream(streams=lambda name: name != "apply_patch")
    assert call.feed('{"name": "apply_patch", "arguments": {"input": "x"}}') == []
    assert call.held and not call.begun


def test_an_unfinished_or_different_object_is_not_the_final_value():
    _, _, call = run(['{"name": "f", "arguments": {"a": 1'])
    assert not call.args.complete
    assert call.final_arguments('{"a":1}') == '{"a":1}'
    _, _, call = run(['{"name": "f", "arguments": {"a": 1}}'])
    assert call.final_arguments('{"a":2}') == '{"a":2}'  # a parser that read otherwise wins
