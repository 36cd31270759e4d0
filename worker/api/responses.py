"""POST /v1/responses on the worker: stateless generation for the Responses API.

The supervisor expands `previous_response_id` into the full `input` and stores the result;
here the request is answered as given.
"""

from __future__ import annotations

import uuid

import orjson
from aiohttp import web

from mlxd.shared.chat_job import ChatJob
from mlxd.shared.wire.bodies import load_json, parse_model
from mlxd.shared.wire.responses import (
    CustomToolCallItem,
    FunctionCallItem,
    MessageItem,
    OutputText,
    ReasoningItem,
    ReasoningText,
    Response,
    ResponsesRequest,
    ResponseUsage,
    StreamEvent,
)
from mlxd.shared.wire.tools import custom_input
from mlxd.worker.api import sse
from mlxd.worker.api.openai import _usage
from mlxd.worker.cache.keys import session_of
from mlxd.worker.chat.run import ChatRun, Collected, Delta, Done, Keepalive, ToolCalls
from mlxd.worker.chat.tool_calls import ToolCall
from mlxd.worker.state import WorkerState


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _finish(body: Response, run: ChatRun, done: Done) -> None:
    """Set status, usage and error from the row's end."""
    u = _usage(run.gen, done.completion_tokens)
    body.usage = ResponseUsage.of(
        u.prompt_tokens, u.completion_tokens, u.prompt_tokens_details.cached_tokens
    )
    if done.error is not None:
        body.status = "failed"
        body.error = {"code": "server_error", "message": done.error.message}
    elif done.finish_reason == "length":
        body.status = "incomplete"
        body.incomplete_details = {"reason": "max_output_tokens"}
    else:
        body.status = "completed"


def _call_item(call: ToolCall, job: ChatJob) -> FunctionCallItem | CustomToolCallItem:
    """The call as the client declared the tool: a custom tool's call carries its text, a
    namespaced one its namespace and plain name (what Codex looks the handler up by)."""
    origin = job.tool_origins.get(call.name)
    if origin is not None and origin.custom:
        return CustomToolCallItem(
            id=_id("ctc"), call_id=call.id, name=origin.name, input=custom_input(call.arguments)
        )
    if origin is not None and origin.namespace is not None:
        return FunctionCallItem(
            id=_id("fc"),
            call_id=call.id,
            name=origin.name,
            namespace=origin.namespace,
            arguments=call.arguments,
        )
    return FunctionCallItem(id=_id("fc"), call_id=call.id, name=call.name, arguments=call.arguments)


def _output(out: Collected, job: ChatJob) -> list:
    items: list = []
    if out.reasoning:
        items.append(ReasoningItem(id=_id("rs"), content=[ReasoningText(text=out.reasoning)]))
    if out.text or not out.calls:
        items.append(MessageItem(id=_id("msg"), content=[OutputText(text=out.text)]))
    return items + [_call_item(c, job) for c in out.calls]


async def responses(request: web.Request) -> web.StreamResponse:
    state: WorkerState = request.app["state"]
    state.ready()
    req = parse_model(ResponsesRequest, load_json(await request.read()))
    job = req.to_chat_job()
    job.session = session_of(request, req)
    rid = _id("resp")
    run = await ChatRun.prepare(state, job, rid)
    request["progress"] = run  # the access log's line if the client leaves
    body = Response.start(rid, req.model or run.m.model_id, req)
    with run:
        if not req.stream:
            out = await run.collect()
            body.output = _output(out, job)
            _finish(body, run, out.done)
            return web.Response(
                body=orjson.dumps(body.model_dump()),
                content_type="application/json",
                headers=run.headers,
            )
        resp = await sse.open_stream(request, run.headers)
        w = _Writer(resp, body, job)
        await w.emit("response.created", response=body.model_dump())
        await w.emit("response.in_progress", response=body.model_dump())
        # Codex's idle watchdog counts SSE events and never sees comments: a quiet stream
        # repeats response.in_progress, which clients parse and ignore.
        beat = sse.Heartbeat(state.config.stream_heartbeat_s)
        async for ev in run.events():
            if isinstance(ev, Keepalive):
                if beat.due():
                    await w.emit("response.in_progress", response=body.model_dump())
                else:
                    await resp.write(sse.KEEPALIVE)
            elif isinstance(ev, Delta):
                beat.touch()
                await w.delta(ev.kind, ev.text)
            elif isinstance(ev, ToolCalls):
                beat.touch()
                for call in ev.calls:
                    await w.call(call)
            elif isinstance(ev, Done):
                await w.close()
                _finish(body, run, ev)
                kind = {"completed": "response.completed", "failed": "response.failed"}.get(
                    body.status, "response.incomplete"
                )
                await w.emit(kind, response=body.model_dump())
        return resp


class _Writer:
    """Streams output items (reasoning, message, function_call) as the output changes kind."""

    def __init__(self, resp: web.StreamResponse, body: Response, job: ChatJob):
        self.resp = resp
        self.body = body
        self.job = job
        self.seq = 0
        self.item = None  # the open MessageItem or ReasoningItem
        self.text: list[str] = []

    async def emit(self, kind: str, **fields) -> None:
        ev = StreamEvent(type=kind, sequence_number=self.seq, **fields)
        self.seq += 1
        await self.resp.write(sse.data(ev, event=kind))

    @property
    def index(self) -> int:
        return len(self.body.output) - 1

    async def _open(self, item, part) -> None:
        await self.close()
        self.body.output.append(item)
        self.item, self.text = item, []
        await self.emit(
            "response.output_item.added", output_index=self.index, item=item.model_dump()
        )
        await self.emit(
            "response.content_part.added",
            item_id=item.id,
            output_index=self.index,
            content_index=0,
            part=part.model_dump(),
        )

    async def delta(self, kind: str, text: str) -> None:
        if not text:
            return
        reasoning = kind == "reasoning"
        if not isinstance(self.item, ReasoningItem if reasoning else MessageItem):
            if reasoning:
                await self._open(ReasoningItem(id=_id("rs")), ReasoningText(text=""))
            else:
                await self._open(
                    MessageItem(id=_id("msg"), status="in_progress"), OutputText(text="")
                )
        self.text.append(text)
        name = "response.reasoning_text.delta" if reasoning else "response.output_text.delta"
        extra = {} if reasoning else {"logprobs": []}
        await self.emit(
            name,
            item_id=self.item.id,
            output_index=self.index,
            content_index=0,
            delta=text,
            **extra,
        )

    async def call(self, call: ToolCall) -> None:
        await self.close()
        item = _call_item(call, self.job)
        self.body.output.append(item)
        custom = isinstance(item, CustomToolCallItem)
        field = "input" if custom else "arguments"
        opened = item.model_copy(update={field: "", "status": "in_progress"})
        at = {"item_id": item.id, "output_index": self.index}
        await self.emit(
            "response.output_item.added", output_index=self.index, item=opened.model_dump()
        )
        if custom:
            await self.emit("response.custom_tool_call_input.delta", delta=item.input, **at)
            await self.emit("response.custom_tool_call_input.done", input=item.input, **at)
        else:
            await self.emit("response.function_call_arguments.delta", delta=item.arguments, **at)
            await self.emit(
                "response.function_call_arguments.done",
                arguments=item.arguments,
                name=item.name,
                **at,
            )
        await self.emit(
            "response.output_item.done", output_index=self.index, item=item.model_dump()
        )

    async def close(self) -> None:
        item, self.item = self.item, None
        if item is None:
            return
        text = "".join(self.text)
        at = {"item_id": item.id, "output_index": self.index, "content_index": 0}
        if isinstance(item, ReasoningItem):
            part = ReasoningText(text=text)
            item.content = [part]
            await self.emit("response.reasoning_text.done", text=text, **at)
        else:
            part = OutputText(text=text)
            item.content, item.status = [part], "completed"
            await self.emit("response.output_text.done", text=text, logprobs=[], **at)
        await self.emit("response.content_part.done", part=part.model_dump(), **at)
        await self.emit(
            "response.output_item.done", output_index=self.index, item=item.model_dump()
        )
