"""POST /v1/responses on the worker: the Responses API writer (stateless generation).

The supervisor expands `previous_response_id` into the full `input` and stores the result;
here the request is answered as given.
"""

from __future__ import annotations

import uuid

from aiohttp import web

from mlxd.shared.chat_job import ChatJob
from mlxd.shared.errors import MlxdError
from mlxd.shared.wire.responses import ResponsesRequest
from mlxd.shared.wire.responses_out import (
    CustomToolCallItem,
    FunctionCallItem,
    MessageItem,
    OutputText,
    ReasoningItem,
    ReasoningText,
    Response,
    ResponseUsage,
    StreamEvent,
)
from mlxd.shared.wire.tools import custom_input
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
from mlxd.worker.chat.tool_calls import ToolCall

_FINAL_EVENTS = {"completed": "response.completed", "failed": "response.failed"}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _finish(body: Response, usage: TokenUsage, done: Done) -> None:
    """Set status, usage and error from the row's end."""
    body.usage = ResponseUsage.of(usage.prompt, usage.completion, usage.cached)
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


def _item_status(body: Response) -> str:
    """The status of the item the row ended in, once `_finish` set the response's: a cut
    (max_output_tokens, a failure) leaves it incomplete."""
    return "completed" if body.status == "completed" else "incomplete"


def _output(out: Collected, job: ChatJob, status: str) -> list:
    """The output items; `status` is the last one's (_item_status)."""
    items: list = []
    if out.reasoning:
        items.append(ReasoningItem(id=_id("rs"), content=[ReasoningText(text=out.reasoning)]))
    if out.text or not out.calls:
        status = "completed" if out.calls else status  # calls come after it: it ended whole
        items.append(MessageItem(id=_id("msg"), status=status, content=[OutputText(text=out.text)]))
    return items + [_call_item(c, job) for c in out.calls]


class ResponsesWriter(Writer):
    """Streams output items (reasoning, message, function_call) as the output changes kind."""

    def __init__(self, req: ResponsesRequest, run, rid: str):
        super().__init__(req, run, rid)
        self.response = Response.start(rid, req.model or run.m.model_id, req)
        self.seq = 0
        self.item: MessageItem | ReasoningItem | None = None  # the open one
        self.text: list[str] = []
        self.call: FunctionCallItem | CustomToolCallItem | None = None  # a call streaming
        self.args: list[str] = []  # its arguments so far

    def _emit(self, kind: str, **fields) -> bytes:
        ev = StreamEvent(type=kind, sequence_number=self.seq, **fields)
        self.seq += 1
        return sse.data(ev, event=kind)

    @property
    def index(self) -> int:
        return len(self.response.output) - 1

    def open(self) -> bytes:
        return self._emit("response.created", response=self.response.model_dump()) + self._emit(
            "response.in_progress", response=self.response.model_dump()
        )

    def keepalive(self, heartbeat_due: bool) -> bytes:
        # Codex's idle watchdog counts SSE events and never sees comments: a quiet stream
        # repeats response.in_progress, which clients parse and ignore. It keeps the object's
        # shape (strict parsers) but not the request's echo: Codex's tools and instructions
        # made every beat 18.7 KB. response.created and the final event carry them whole.
        if heartbeat_due:
            beat = self.response.model_copy(
                update={"instructions": None, "tools": [], "output": []}
            )
            return self._emit("response.in_progress", response=beat.model_dump())
        return sse.KEEPALIVE

    def _open(self, item, part) -> bytes:
        out = self._close()
        self.response.output.append(item)
        self.item, self.text = item, []
        return (
            out
            + self._emit(
                "response.output_item.added", output_index=self.index, item=item.model_dump()
            )
            + self._emit(
                "response.content_part.added",
                item_id=item.id,
                output_index=self.index,
                content_index=0,
                part=part.model_dump(),
            )
        )

    def delta(self, d: Delta) -> bytes:
        if not d.text:
            return b""
        out = b""
        reasoning = d.kind == REASONING
        if not isinstance(self.item, ReasoningItem if reasoning else MessageItem):
            if reasoning:
                out = self._open(ReasoningItem(id=_id("rs")), ReasoningText(text=""))
            else:
                out = self._open(
                    MessageItem(id=_id("msg"), status="in_progress"), OutputText(text="")
                )
        self.text.append(d.text)
        assert self.item is not None  # open already, or _open just opened it
        name = "response.reasoning_text.delta" if reasoning else "response.output_text.delta"
        extra: dict[str, list] = {} if reasoning else {"logprobs": []}
        return out + self._emit(
            name,
            item_id=self.item.id,
            output_index=self.index,
            content_index=0,
            delta=d.text,
            **extra,
        )

    streams_tool_args = True

    def tool_part(self, part: CallPart) -> bytes:
        # As the API streams a function call: the item with empty arguments, then deltas.
        if isinstance(part, ToolCallStart):
            out = self._close()
            item = _call_item(ToolCall(part.id, part.name, ""), self.run.job)
            item.status = "in_progress"
            self.response.output.append(item)
            self.call, self.args = item, []
            return out + self._emit(
                "response.output_item.added", output_index=self.index, item=item.model_dump()
            )
        if self.call is None:
            return b""
        if isinstance(part, ToolCallArgs):
            self.args.append(part.text)
            at = {"item_id": self.call.id, "output_index": self.index}
            return self._emit("response.function_call_arguments.delta", delta=part.text, **at)
        return self._end_call("".join(self.args), "incomplete")  # cut: its text follows

    def _end_call(self, arguments: str, status: str) -> bytes:
        item, self.call = self.call, None
        assert isinstance(item, FunctionCallItem)  # a custom tool's call is never streamed
        item.arguments, item.status = arguments, status
        at = {"item_id": item.id, "output_index": self.index}
        return self._emit(
            "response.function_call_arguments.done", arguments=arguments, name=item.name, **at
        ) + self._emit("response.output_item.done", output_index=self.index, item=item.model_dump())

    def tool_calls(self, calls: list[ToolCall]) -> bytes:
        return b"".join(self._call(c) for c in calls)

    def _call(self, call: ToolCall) -> bytes:
        if call.streamed and self.call is not None:  # its item is open, its arguments sent
            return self._end_call(call.arguments, "completed")
        out = self._close()
        item = _call_item(call, self.run.job)
        self.response.output.append(item)
        field = "input" if isinstance(item, CustomToolCallItem) else "arguments"
        opened = item.model_copy(update={field: "", "status": "in_progress"})
        at = {"item_id": item.id, "output_index": self.index}
        out += self._emit(
            "response.output_item.added", output_index=self.index, item=opened.model_dump()
        )
        if isinstance(item, CustomToolCallItem):
            out += self._emit("response.custom_tool_call_input.delta", delta=item.input, **at)
            out += self._emit("response.custom_tool_call_input.done", input=item.input, **at)
        else:
            out += self._emit("response.function_call_arguments.delta", delta=item.arguments, **at)
            out += self._emit(
                "response.function_call_arguments.done",
                arguments=item.arguments,
                name=item.name,
                **at,
            )
        return out + self._emit(
            "response.output_item.done", output_index=self.index, item=item.model_dump()
        )

    def _close(self, status: str = "completed") -> bytes:
        """End the open item: `status` "incomplete" when the row was cut in it."""
        if self.call is not None:  # a call that streamed and got no end (the row failed)
            return self._end_call("".join(self.args), "incomplete")
        item, self.item = self.item, None
        if item is None:
            return b""
        text = "".join(self.text)
        at = {"item_id": item.id, "output_index": self.index, "content_index": 0}
        part: ReasoningText | OutputText
        if isinstance(item, ReasoningItem):
            part = ReasoningText(text=text)
            item.content = [part]
            out = self._emit("response.reasoning_text.done", text=text, **at)
        else:
            part = OutputText(text=text)
            item.content, item.status = [part], status
            out = self._emit("response.output_text.done", text=text, logprobs=[], **at)
        out += self._emit("response.content_part.done", part=part.model_dump(), **at)
        return out + self._emit(
            "response.output_item.done", output_index=self.index, item=item.model_dump()
        )

    def done(self, done: Done, usage: TokenUsage) -> bytes:
        _finish(self.response, usage, done)
        out = self._close(_item_status(self.response))
        kind = _FINAL_EVENTS.get(self.response.status, "response.incomplete")
        return out + self._emit(kind, response=self.response.model_dump())

    def error(self, err: MlxdError, usage: TokenUsage) -> bytes:
        # The failed response carries the error (`response.failed`), as the API streams it.
        return self.done(Done("error", usage.completion, error=err), usage)

    def body(self, out: Collected, usage: TokenUsage) -> Response:
        _finish(self.response, usage, out.done)
        self.response.output = _output(out, self.run.job, _item_status(self.response))
        return self.response


RESPONSES = Surface(ResponsesRequest, "resp_", ResponsesWriter)


async def responses(request: web.Request) -> web.StreamResponse:
    return await serve(request, RESPONSES)
