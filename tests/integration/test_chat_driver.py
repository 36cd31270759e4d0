"""The chat driver's stream over fake runs, in every dialect, and the proxy's marker cutter.

The worker writes one first-token marker in front of the first generated text; the supervisor
cuts it out as the stream passes and times the first token by it.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import orjson
import pytest

from mlxd.shared.chat_job import ChatJob, RawPrompt
from mlxd.shared.errors import Unavailable
from mlxd.shared.params import GenerationParams
from mlxd.shared.wire.anthropic import MessagesRequest
from mlxd.shared.wire.completions import CompletionRequest
from mlxd.shared.wire.first_token import FIRST_TOKEN, FirstTokenCutter
from mlxd.shared.wire.openai import ChatCompletionRequest
from mlxd.shared.wire.responses import ResponsesRequest
from mlxd.worker.api.anthropic import MessagesWriter
from mlxd.worker.api.completions import CompletionWriter
from mlxd.worker.api.driver import stream_bytes
from mlxd.worker.api.openai import ChatWriter
from mlxd.worker.api.responses import ResponsesWriter
from mlxd.worker.api.sse import Heartbeat
from mlxd.worker.chat.events import Delta, Done, Keepalive, TokenUsage, ToolCalls
from mlxd.worker.chat.tool_calls import ToolCall

MSG = [{"role": "user", "content": "hi"}]
SURFACES = [
    (ChatWriter, ChatCompletionRequest, {"messages": MSG, "stream": True}),
    (MessagesWriter, MessagesRequest, {"messages": MSG, "max_tokens": 8, "stream": True}),
    (ResponsesWriter, ResponsesRequest, {"input": "hi", "stream": True}),
]

PATHS = {
    ChatWriter: "/v1/chat/completions",
    MessagesWriter: "/v1/messages",
    ResponsesWriter: "/v1/responses",
    CompletionWriter: "/v1/completions",
}


def _run(events, echo: str = ""):
    async def gen(tool_parts=False):
        for ev in events:
            yield ev

    return SimpleNamespace(
        m=SimpleNamespace(model_id="tiny", tokenizer=None),
        job=ChatJob(messages=[], params=GenerationParams()),
        params=GenerationParams(),
        echo=echo,
        events=gen,
        usage=lambda done: TokenUsage(10, done.completion_tokens, 4),
        completion_tokens=0,
    )


def _stream(writer_cls, req_cls, body, events, echo: str = "") -> bytes:
    run = _run(events, echo)
    writer = writer_cls(req_cls.model_validate(body), run, "id-1")

    async def collect():
        path = PATHS[writer_cls]
        return [b async for b in stream_bytes(run, writer, Heartbeat(60.0), path)]

    return b"".join(asyncio.run(collect()))


def _before_marker_and_after(data: bytes) -> tuple[bytes, bytes]:
    assert data.count(FIRST_TOKEN) == 1
    head, tail = data.split(FIRST_TOKEN)
    return head, tail


@pytest.mark.parametrize(("writer", "req", "body"), SURFACES)
def test_the_marker_comes_once_right_before_the_first_generated_text(writer, req, body):
    events = [
        Keepalive(),
        Delta("text", ""),  # logprobs only, no text: not a token yet
        Keepalive(),
        Delta("text", "Hello"),
        Delta("text", " there"),
        Done("stop", 2),
    ]
    head, tail = _before_marker_and_after(_stream(writer, req, body, events))
    assert b"Hello" not in head and tail.count(b"Hello") >= 1


@pytest.mark.parametrize(("writer", "req", "body"), SURFACES)
def test_a_tool_call_is_a_first_token_too(writer, req, body):
    body = {**body, "tools": None}
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    head, tail = _before_marker_and_after(
        _stream(writer, req, body, [Keepalive(), ToolCalls([call]), Done("tool_calls", 9)])
    )
    assert b"get_weather" in tail and b"call_1" not in head


@pytest.mark.parametrize(("writer", "req", "body"), SURFACES)
def test_a_row_that_fails_before_any_token_has_no_marker(writer, req, body):
    data = _stream(writer, req, body, [Keepalive(), Done("error", 0, error=Unavailable("gone"))])
    assert FIRST_TOKEN not in data and b"gone" in data


class _Broken(Exception):
    pass


def _raise(exc):
    raise exc


@pytest.mark.parametrize(("writer", "req", "body"), SURFACES)
@pytest.mark.parametrize("after", [0, 1, 2], ids=["at once", "after text", "after a call"])
def test_a_run_that_raises_ends_the_stream_with_the_error_event_and_terminator(
    writer, req, body, after
):
    """The model's output itself may fail to parse or serialize (issue 31): a raise inside
    the run's events, wherever it comes, still ends the client's stream."""
    call = ToolCall("call_1", "f", "{}")
    events = [Delta("text", "Hello"), ToolCalls([call])][:after]

    async def gen(tool_parts=False):
        for ev in events:
            yield ev
        _raise(_Broken("Integer exceeds 64-bit range"))

    run = _run([])
    run.events = gen
    w = writer(req.model_validate({**body, "tools": None}), run, "id-1")

    async def collect():
        return [b async for b in stream_bytes(run, w, Heartbeat(60.0), PATHS[writer])]

    data = b"".join(asyncio.run(collect())).replace(FIRST_TOKEN, b"")
    last = data.rstrip(b"\n").split(b"\n\n")
    assert b"Integer exceeds" not in data  # the cause is the log's, not the client's
    if writer is ChatWriter:
        assert last[-1] == b"data: [DONE]"
        assert orjson.loads(last[-2][6:])["error"]["type"] == "server_error"
    elif writer is MessagesWriter:
        assert last[-1].startswith(b"event: error\ndata: ")
        assert orjson.loads(last[-1].split(b"data: ")[1])["error"]["type"] == "api_error"
    else:
        assert last[-1].startswith(b"event: response.failed\ndata: ")
        failed = orjson.loads(last[-1].split(b"data: ")[1])["response"]
        assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"


def test_completions_mark_the_generated_text_not_the_echo_and_end_with_one_chunk():
    body = {"prompt": "Once", "stream": True, "stream_options": {"include_usage": True}}
    events = [Delta("text", " upon", last=False), Delta("text", " a", last=True), Done("length", 2)]
    data = _stream(CompletionWriter, CompletionRequest, body, events, echo="Once")
    head, tail = _before_marker_and_after(data)
    assert b'"text":"Once"' in head and b"upon" in tail
    chunks = [orjson.loads(b[6:]) for b in data.split(b"\n\n") if b.startswith(b"data: {")]
    assert [c["choices"][0]["text"] for c in chunks if c["choices"]] == ["Once", " upon", " a"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"  # last text with its finish
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 4
    assert data.endswith(b"data: [DONE]\n\n")


def test_a_completion_whose_only_token_ends_it_marks_the_final_chunk():
    body = {"prompt": "Once", "stream": True}
    data = _stream(
        CompletionWriter, CompletionRequest, body, [Delta("text", "!", last=True), Done("stop", 1)]
    )
    _, tail = _before_marker_and_after(data)
    assert (
        tail.startswith(b"data: ") and b'"text":"!"' in tail and b'"finish_reason":"stop"' in tail
    )


def test_the_openai_stream_error_uses_the_shared_envelope():
    data = _stream(
        ChatWriter,
        ChatCompletionRequest,
        SURFACES[0][2],
        [Done("error", 0, error=Unavailable("x"))],
    )
    errors = [orjson.loads(b[6:]) for b in data.split(b"\n\n") if b.startswith(b'data: {"error"')]
    assert errors == [
        {"error": {"message": "x", "type": "server_error", "param": None, "code": None}}
    ]


def test_usage_is_neutral_until_each_writer_words_it():
    done = [Delta("text", "a"), Done("stop", 1)]
    anthropic = _stream(MessagesWriter, MessagesRequest, SURFACES[1][2], done)
    assert b'"input_tokens":6,"output_tokens":1' in anthropic  # 10 prompt, 4 of them cached
    assert b'"cache_read_input_tokens":4' in anthropic
    responses = _stream(ResponsesWriter, ResponsesRequest, SURFACES[2][2], done)
    assert b'"input_tokens":10,"input_tokens_details":{"cached_tokens":4}' in responses


def test_completions_job_carries_its_prompt_instead_of_messages():
    job = CompletionRequest.model_validate({"prompt": ["one"], "echo": True}).to_chat_job()
    assert job.messages == [] and job.raw == RawPrompt("one", echo=True)


# -- the proxy's side ---------------------------------------------------------------------
STREAM = b"data: {}\n\n" + FIRST_TOKEN + b'data: {"content":"Hi"}\n\n' + b"data: [DONE]\n\n"
CLEAN = STREAM.replace(FIRST_TOKEN, b"")


@pytest.mark.parametrize("cut_at", range(1, len(STREAM)))
def test_the_cutter_removes_the_marker_wherever_the_chunks_split(cut_at):
    cutter = FirstTokenCutter()
    out, seen = b"", []
    for chunk in (STREAM[:cut_at], STREAM[cut_at:]):
        data, first = cutter.cut(chunk)
        out += data
        seen.append(first)
    out += cutter.flush()
    assert out == CLEAN and seen.count(True) == 1
    # The marker is reported with the chunk that completes it, never before.
    assert seen[0] == (cut_at >= STREAM.index(FIRST_TOKEN) + len(FIRST_TOKEN))


def test_the_cutter_passes_a_stream_without_a_marker_through_unchanged():
    cutter = FirstTokenCutter()
    pieces = [b"data: {}\n\n:", b" keep-alive\n\n", b"data: [DONE]\n\n:"]
    out = b"".join(cutter.cut(p)[0] for p in pieces) + cutter.flush()
    assert out == b"".join(pieces) and not cutter.seen
    # Only the first marker is the worker's: anything after it passes untouched.
    cutter = FirstTokenCutter()
    assert cutter.cut(FIRST_TOKEN * 2) == (FIRST_TOKEN, True)
