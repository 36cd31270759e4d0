"""POST /v1/messages and /v1/messages/count_tokens: the Anthropic Messages writer."""

from __future__ import annotations

import orjson
from aiohttp import web

from mlxd.shared.adapters import ADAPTER_HEADER
from mlxd.shared.chat_job import refuse_images
from mlxd.shared.errors import MlxdError, anthropic_body
from mlxd.shared.wire.anthropic import CountTokensRequest, MessagesRequest
from mlxd.shared.wire.anthropic_answers import (
    AnthropicUsage,
    Block,
    BlockDelta,
    BlockStart,
    BlockStop,
    CountTokens,
    InputJsonDelta,
    Message,
    MessageDelta,
    MessageDeltaBody,
    MessageStart,
    MessageStop,
    Ping,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolUseBlock,
    stop_reason,
)
from mlxd.shared.wire.bodies import load_json, parse_model
from mlxd.worker.api import sse
from mlxd.worker.api.driver import Surface, Writer, serve
from mlxd.worker.chat.events import (
    CallPart,
    Collected,
    Delta,
    Done,
    TokenUsage,
    ToolCallArgs,
    ToolCallStart,
)
from mlxd.worker.chat.output import REASONING
from mlxd.worker.chat.prompts import prepare_messages, render_job
from mlxd.worker.chat.state import WorkerState, adapter_ns
from mlxd.worker.chat.tool_calls import ToolCall
from mlxd.worker.chat.vision import with_images


def anthropic_usage(u: TokenUsage) -> AnthropicUsage:
    """Anthropic counts cache reads apart from the input tokens it processed."""
    return AnthropicUsage(
        input_tokens=u.prompt - u.cached,
        output_tokens=u.completion,
        cache_read_input_tokens=u.cached,
    )


def _event(ev) -> bytes:
    return sse.data(ev, event=ev.type)


# What a quiet stream sends every stream_heartbeat_s: Claude Code's idle watchdog ignores
# `ping`, while an interim message_delta with no stop reason and no tokens changes nothing in
# the SDK's accumulated message (the final message_delta overwrites every field it sets).
_HEARTBEAT = MessageDelta(delta=MessageDeltaBody(stop_reason=None), usage={"output_tokens": 0})


TOOL_USE = "tool_use"  # the open block's kind while a call streams


class MessagesWriter(Writer):
    """Message events; content blocks open and close as the output changes kind."""

    def __init__(self, req: MessagesRequest, run, rid: str):
        super().__init__(req, run, rid)
        self.model = req.model or run.m.model_id
        self.index = -1
        self.kind: str | None = None  # the kind of the open block (text, thinking, tool use)
        self.answered = False  # a text block or a tool call went out

    def open(self) -> bytes:
        # Token counts come with the final message_delta: Claude Code adds a message_delta's
        # running usage to its totals once per event, so heartbeats must carry zeros.
        start = Message(
            id=self.rid,
            model=self.model,
            content=[],
            usage=AnthropicUsage(input_tokens=0, output_tokens=0),
        )
        return _event(MessageStart(message=start)) + _event(Ping())

    def keepalive(self, heartbeat_due: bool) -> bytes:
        return _event(_HEARTBEAT if heartbeat_due else Ping())

    def delta(self, d: Delta) -> bytes:
        if not d.text:
            return b""
        out = b""
        self.answered = self.answered or d.kind != REASONING
        if self.kind != d.kind:
            out = self._close()
            self.index += 1
            self.kind = d.kind
            block = ThinkingBlock(thinking="") if d.kind == REASONING else TextBlock(text="")
            out += _event(BlockStart(index=self.index, content_block=block))
        delta = ThinkingDelta(thinking=d.text) if d.kind == REASONING else TextDelta(text=d.text)
        return out + _event(BlockDelta(index=self.index, delta=delta))

    streams_tool_args = True

    def tool_part(self, part: CallPart) -> bytes:
        # As Anthropic streams tool_use: the block with an empty input, then partial JSON.
        if isinstance(part, ToolCallStart):
            self.answered = True
            out = self._close()
            self.index += 1
            self.kind = TOOL_USE
            block = ToolUseBlock(id=part.id, name=part.name, input={})
            return out + _event(BlockStart(index=self.index, content_block=block))
        if isinstance(part, ToolCallArgs):
            delta = InputJsonDelta(partial_json=part.text)
            return _event(BlockDelta(index=self.index, delta=delta))
        return self._close()  # cut: its text follows in a text block

    def tool_calls(self, calls: list[ToolCall]) -> bytes:
        self.answered = self.answered or bool(calls)
        return b"".join(self._tool_use(c) for c in calls)

    def _tool_use(self, call: ToolCall) -> bytes:
        if call.streamed:  # its block is open, its input sent
            return self._close()
        out = self._close()
        self.index += 1
        block = ToolUseBlock(id=call.id, name=call.name, input={})
        delta = InputJsonDelta(partial_json=call.arguments)
        return (
            out
            + _event(BlockStart(index=self.index, content_block=block))
            + _event(BlockDelta(index=self.index, delta=delta))
            + _event(BlockStop(index=self.index))
        )

    def _close(self) -> bytes:
        if self.kind is None:
            return b""
        self.kind = None
        return _event(BlockStop(index=self.index))

    def done(self, done: Done, usage: TokenUsage) -> bytes:
        delta = MessageDeltaBody(
            stop_reason=stop_reason(done.finish_reason, done.stop_sequence),
            stop_sequence=done.stop_sequence,
        )
        final = MessageDelta(delta=delta, usage=anthropic_usage(usage).model_dump())
        return self._close() + self._empty_text() + _event(final) + _event(MessageStop())

    def _empty_text(self) -> bytes:
        """An answer of no text and no tool call (a few tokens that decode to nothing) still
        streams one empty text block, as its non-streamed body has one (body())."""
        if self.answered:
            return b""
        self.index += 1
        return _event(BlockStart(index=self.index, content_block=TextBlock(text=""))) + _event(
            BlockStop(index=self.index)
        )

    def error(self, err: MlxdError, usage: TokenUsage) -> bytes:
        return self._close() + sse.data(anthropic_body(err), event="error")

    def body(self, out: Collected, usage: TokenUsage) -> Message:
        blocks: list[Block] = [ThinkingBlock(thinking=out.reasoning)] if out.reasoning else []
        if out.text or not out.calls:
            blocks.append(TextBlock(text=out.text))
        blocks += [ToolUseBlock(id=c.id, name=c.name, input=c.input) for c in out.calls]
        return Message(
            id=self.rid,
            model=self.model,
            content=blocks,
            stop_reason=stop_reason(out.done.finish_reason, out.done.stop_sequence),
            stop_sequence=out.done.stop_sequence,
            usage=anthropic_usage(usage),
        )


MESSAGES = Surface(MessagesRequest, "msg_", MessagesWriter)


async def messages(request: web.Request) -> web.StreamResponse:
    return await serve(request, MESSAGES)


async def count_tokens(request: web.Request) -> web.Response:
    state: WorkerState = request.app["state"]
    m, engine = state.ready()
    # An adapter shares its base's tokenizer: it counts alike, but must be mounted (as a
    # generation would check it, chat/state.py).
    adapter_ns(state, engine, request.headers.get(ADAPTER_HEADER) or None)
    req = parse_model(CountTokensRequest, load_json(await request.read()))
    job = req.to_chat_job()
    if job.images and state.vision is None:  # as a generation would (chat/run.py)
        refuse_images(job, state.config.model_id)
    # What a generation would render: the default system prompt counts, attribution lines not.
    job.messages = prepare_messages(m, job.messages, state.config.strip_attribution_lines)
    prompt = render_job(m, job, state.config.enable_thinking)
    if job.images:  # each image counts the tokens its features take
        prompt, _ = await with_images(state, job, prompt)
    return web.Response(
        body=orjson.dumps(CountTokens(input_tokens=len(prompt.ids)).model_dump()),
        content_type="application/json",
    )
