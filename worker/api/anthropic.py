"""POST /v1/messages and /v1/messages/count_tokens (the Anthropic Messages API)."""

from __future__ import annotations

import uuid

import orjson
from aiohttp import web

from mlxd.shared.errors import sse_error_bytes
from mlxd.shared.wire.anthropic import (
    AnthropicUsage,
    BlockDelta,
    BlockStart,
    BlockStop,
    CountTokens,
    CountTokensRequest,
    InputJsonDelta,
    Message,
    MessageDelta,
    MessageDeltaBody,
    MessagesRequest,
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
from mlxd.worker.api.openai import _usage
from mlxd.worker.cache.keys import session_of
from mlxd.worker.chat.run import ChatRun, Delta, Done, Keepalive, ToolCalls, render_job
from mlxd.worker.state import WorkerState


def _anthropic_usage(run: ChatRun, output_tokens: int) -> AnthropicUsage:
    u = _usage(run.gen, output_tokens)
    cached = u.prompt_tokens_details.cached_tokens
    return AnthropicUsage(
        input_tokens=u.prompt_tokens - cached,
        output_tokens=output_tokens,
        cache_read_input_tokens=cached,
    )


def _event(ev) -> bytes:
    return sse.data(ev, event=ev.type)


# What a quiet stream sends every stream_heartbeat_s: Claude Code's idle watchdog ignores
# `ping`, while an interim message_delta with no stop reason and no tokens changes nothing in
# the SDK's accumulated message (the final message_delta overwrites every field it sets).
_HEARTBEAT = MessageDelta(delta=MessageDeltaBody(stop_reason=None), usage={"output_tokens": 0})


async def messages(request: web.Request) -> web.StreamResponse:
    state: WorkerState = request.app["state"]
    state.ready()
    req = parse_model(MessagesRequest, load_json(await request.read()))
    job = req.to_chat_job()
    job.session = job.session or session_of(request, req)
    rid = "msg_" + uuid.uuid4().hex[:24]
    run = await ChatRun.prepare(state, job, rid)
    request["progress"] = run  # the access log's line if the client leaves
    model = req.model or run.m.model_id
    with run:
        if not req.stream:
            out = await run.collect()
            blocks = [ThinkingBlock(thinking=out.reasoning)] if out.reasoning else []
            if out.text or not out.calls:
                blocks.append(TextBlock(text=out.text))
            blocks += [ToolUseBlock(id=c.id, name=c.name, input=c.input) for c in out.calls]
            body = Message(
                id=rid,
                model=model,
                content=blocks,
                stop_reason=stop_reason(out.done.finish_reason, out.done.stop_sequence),
                stop_sequence=out.done.stop_sequence,
                usage=_anthropic_usage(run, out.done.completion_tokens),
            )
            return web.Response(
                body=orjson.dumps(body.model_dump()),
                content_type="application/json",
                headers=run.headers,
            )
        resp = await sse.open_stream(request, run.headers)
        # Token counts come with the final message_delta: Claude Code adds a message_delta's
        # running usage to its totals once per event, so heartbeats must carry zeros.
        start = Message(
            id=rid, model=model, content=[], usage=AnthropicUsage(input_tokens=0, output_tokens=0)
        )
        await resp.write(_event(MessageStart(message=start)))
        await resp.write(_event(Ping()))
        blocks = _BlockWriter(resp)
        beat = sse.Heartbeat(state.config.stream_heartbeat_s)
        async for ev in run.events():
            if isinstance(ev, Keepalive):
                await resp.write(_event(_HEARTBEAT if beat.due() else Ping()))
            elif isinstance(ev, Delta):
                beat.touch()
                await blocks.text(ev.kind, ev.text)
            elif isinstance(ev, ToolCalls):
                beat.touch()
                for c in ev.calls:
                    await blocks.tool_use(c)
            elif isinstance(ev, Done):
                await blocks.close()
                if ev.error is not None:
                    await resp.write(sse_error_bytes(ev.error, request.path))
                    break
                delta = MessageDeltaBody(
                    stop_reason=stop_reason(ev.finish_reason, ev.stop_sequence),
                    stop_sequence=ev.stop_sequence,
                )
                usage = _anthropic_usage(run, ev.completion_tokens)  # cache hits known now
                await resp.write(_event(MessageDelta(delta=delta, usage=usage.model_dump())))
                await resp.write(_event(MessageStop()))
        return resp


class _BlockWriter:
    """Opens and closes content blocks as the output changes kind."""

    def __init__(self, resp: web.StreamResponse):
        self.resp = resp
        self.index = -1
        self.open: str | None = None

    async def text(self, kind: str, text: str) -> None:
        if not text:
            return
        if self.open != kind:
            await self.close()
            self.index += 1
            self.open = kind
            block = ThinkingBlock(thinking="") if kind == "reasoning" else TextBlock(text="")
            await self.resp.write(_event(BlockStart(index=self.index, content_block=block)))
        delta = ThinkingDelta(thinking=text) if kind == "reasoning" else TextDelta(text=text)
        await self.resp.write(_event(BlockDelta(index=self.index, delta=delta)))

    async def tool_use(self, call) -> None:
        await self.close()
        self.index += 1
        block = ToolUseBlock(id=call.id, name=call.name, input={})
        await self.resp.write(_event(BlockStart(index=self.index, content_block=block)))
        await self.resp.write(
            _event(BlockDelta(index=self.index, delta=InputJsonDelta(partial_json=call.arguments)))
        )
        await self.resp.write(_event(BlockStop(index=self.index)))

    async def close(self) -> None:
        if self.open is not None:
            await self.resp.write(_event(BlockStop(index=self.index)))
            self.open = None


async def count_tokens(request: web.Request) -> web.Response:
    state: WorkerState = request.app["state"]
    m, _ = state.ready()
    req = parse_model(CountTokensRequest, load_json(await request.read()))
    job = req.to_chat_job()
    prompt = render_job(m, job, state.config.enable_thinking)
    return web.Response(
        body=orjson.dumps(CountTokens(input_tokens=len(prompt.ids)).model_dump()),
        content_type="application/json",
    )
