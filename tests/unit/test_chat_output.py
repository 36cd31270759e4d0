"""The output splitter: reasoning, answer text and tool-call blocks from streamed deltas."""

from __future__ import annotations

import pytest

from mlxd.worker.chat.output import OutputSplitter

THINK = ("<think>", "</think>")
TOOL = ("<tool_call>", "</tool_call>")
CALL = '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'


def split(deltas: list[str], **kw) -> list[tuple[str, str]]:
    s = OutputSplitter(THINK, TOOL, **kw)
    pieces = [p for d in deltas for p in s.feed(d)] + s.finish()
    merged: list[tuple[str, str]] = []
    for p in pieces:  # adjacent pieces of one kind are one run
        if merged and merged[-1][0] == p.kind and p.kind != "tool":
            merged[-1] = (p.kind, merged[-1][1] + p.text)
        else:
            merged.append((p.kind, p.text))
    return merged


def chunks(text: str, n: int) -> list[str]:
    return [text[i : i + n] for i in range(0, len(text), n)]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 100])
def test_reasoning_then_answer_whatever_the_delta_sizes(n):
    text = "<think>\nLet me think.\n</think>\n\nThe answer is 4."
    assert split(chunks(text, n)) == [("reasoning", "Let me think."), ("text", "The answer is 4.")]


@pytest.mark.parametrize("n", [1, 4, 100])
def test_tool_calls_are_whole_blocks_and_layout_is_dropped(n):
    text = f"I will check.\n<tool_call>{CALL}</tool_call>\n<tool_call>{CALL}</tool_call>\n"
    assert split(chunks(text, n)) == [("text", "I will check."), ("tool", CALL), ("tool", CALL)]


def test_prompt_that_opened_a_think_block_starts_in_reasoning():
    assert split(["still thinking", " here</think>ok"], in_reasoning=True) == [
        ("reasoning", "still thinking here"),
        ("text", "ok"),
    ]


def test_cut_off_reasoning_stays_reasoning():
    assert split(["<think>abc def"]) == [("reasoning", "abc def")]


def test_unfinished_tool_call_is_kept_as_text():
    assert split(['<tool_call>\n{"name": "f"']) == [("text", '<tool_call>\n{"name": "f"')]


def test_plain_text_is_exact_including_whitespace():
    text = "  Hello <b>world</b> <thin 1 < 2 \n"
    assert "".join(t for _, t in split(chunks(text, 3))) == text


def test_without_markers_nothing_is_special():
    s = OutputSplitter(None, None)
    out = s.feed("<think>x</think>") + s.finish()
    assert [(p.kind, p.text) for p in out] == [("text", "<think>x</think>")]
