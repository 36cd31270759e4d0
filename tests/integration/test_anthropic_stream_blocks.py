"""The Messages stream's content blocks match the non-streamed body's, whatever came out."""

from __future__ import annotations

import json

from mlxd.shared.wire.anthropic import MessagesRequest
from mlxd.worker.api.anthropic import MessagesWriter
from mlxd.worker.chat.events import Delta, Done, TokenUsage

REQ = MessagesRequest(model="a", max_tokens=3, messages=[{"role": "user", "content": "hi"}])
USAGE = TokenUsage(prompt=5, completion=3, cached=0)


def _events(raw: bytes) -> list[dict]:
    return [
        json.loads(line[len(b"data: ") :])
        for line in raw.splitlines()
        if line.startswith(b"data: ")
    ]


def _stream(*deltas: Delta) -> list[dict]:
    w = MessagesWriter(REQ, None, "msg_1")
    raw = w.open() + b"".join(w.delta(d) for d in deltas) + w.done(Done("length", 3), USAGE)
    return _events(raw)


def test_an_answer_that_decoded_to_no_text_still_streams_one_empty_text_block():
    events = _stream(Delta("text", ""))
    blocks = [e for e in events if e["type"].startswith("content_block")]
    assert [e["type"] for e in blocks] == ["content_block_start", "content_block_stop"]
    assert blocks[0]["content_block"] == {"type": "text", "text": ""}
    assert events[-2]["type"] == "message_delta" and events[-1]["type"] == "message_stop"


def test_reasoning_alone_is_followed_by_an_empty_text_block_as_in_the_body():
    events = _stream(Delta("reasoning", "hmm"))
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    assert [e["index"] for e in events if e["type"] == "content_block_start"] == [0, 1]


def test_text_streams_one_block_and_no_extra_one():
    events = _stream(Delta("text", "he"), Delta("text", "llo"))
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert len(starts) == 1
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == "hello"
