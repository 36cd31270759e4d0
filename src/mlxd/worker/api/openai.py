"""POST /v1/chat/completions on the worker's socket: the OpenAI chat writer."""

from __future__ import annotations

import time

from aiohttp import web

from mlxd.shared.chat_job import ChatJob
from mlxd.shared.errors import MlxdError, openai_body
from mlxd.shared.wire.openai import ChatCompletionRequest
from mlxd.shared.wire.openai_out import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChunkChoice,
    ChunkDelta,
    ResponseMessage,
    Usage,
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
from mlxd.worker.engine.step.logprobs import chat_logprobs


def openai_usage(u: TokenUsage) -> Usage:
    """OpenAI's usage object (chat and legacy completions)."""
    return Usage.of(u.prompt, u.completion, cached=u.cached)


def stream_error(err: MlxdError) -> bytes:
    """How an OpenAI stream ends when its row fails: the error envelope, then [DONE]."""
    return sse.data(openai_body(err)) + sse.DONE


class ChatWriter(Writer):
    """Chat completion chunks: a role-only chunk first, then deltas, then the finish."""

    def __init__(self, req: ChatCompletionRequest, run, rid: str):
        super().__init__(req, run, rid)
        self.created = int(time.time())

    def _chunk(self, choices: list[ChunkChoice], usage: Usage | None = None) -> bytes:
        return sse.data(
            ChatCompletionChunk(
                id=self.rid,
                created=self.created,
                model=self.run.m.model_id,
                choices=choices,
                usage=usage,
            )
        )

    def _delta(self, delta: ChunkDelta, finish=None, logprobs=None) -> bytes:
        return self._chunk([ChunkChoice(delta=delta, finish_reason=finish, logprobs=logprobs)])

    def open(self) -> bytes:
        return self._delta(ChunkDelta(role="assistant", content=""))

    def delta(self, d: Delta) -> bytes:
        lp = chat_logprobs(self.run.m.tokenizer, d.logprobs) if d.logprobs else None
        delta = (
            ChunkDelta(reasoning_content=d.text)
            if d.kind == REASONING
            else ChunkDelta(content=d.text)
        )
        return self._delta(delta, logprobs=lp)

    streams_tool_args = True

    def tool_part(self, part: CallPart) -> bytes:
        # As OpenAI streams a call: id, type and name first, then `arguments` in fragments.
        if isinstance(part, ToolCallStart):
            function = {"name": part.name, "arguments": ""}
            delta = {"index": part.index, "id": part.id, "type": "function", "function": function}
        elif isinstance(part, ToolCallArgs):
            delta = {"index": part.index, "function": {"arguments": part.text}}
        else:  # a cut call's text follows as content: nothing to close
            return b""
        return self._delta(ChunkDelta(tool_calls=[delta]))

    def tool_calls(self, calls: list[ToolCall]) -> bytes:
        # A call that streamed is whole already: its fragments are its arguments
        whole = [c for c in calls if not c.streamed]
        deltas = [{"index": c.index, **_tool_call(c, self.run.job)} for c in whole]
        return self._delta(ChunkDelta(tool_calls=deltas)) if deltas else b""

    def done(self, done: Done, usage: TokenUsage) -> bytes:
        out = self._delta(ChunkDelta(), finish=done.finish_reason)
        if self.req.include_usage:
            out += self._chunk([], usage=openai_usage(usage))
        return out + sse.DONE

    def error(self, err: MlxdError, usage: TokenUsage) -> bytes:
        return stream_error(err)

    def body(self, out: Collected, usage: TokenUsage) -> ChatCompletion:
        run = self.run
        message = ResponseMessage(
            content=out.text or (None if out.calls else ""),
            reasoning_content=out.reasoning or None,
            tool_calls=[_tool_call(c, run.job) for c in out.calls] or None,
        )
        choice = ChatChoice(
            message=message,
            finish_reason=out.done.finish_reason,
            logprobs=chat_logprobs(run.m.tokenizer, out.logprobs) if run.params.logprobs else None,
        )
        return ChatCompletion(
            id=self.rid, model=run.m.model_id, choices=[choice], usage=openai_usage(usage)
        )


def _tool_call(call: ToolCall, job: ChatJob) -> dict:
    origin = job.tool_origins.get(call.name)
    if origin is not None and origin.custom:  # declared as a custom tool: answered as one
        return {
            "id": call.id,
            "type": "custom",
            "custom": {"name": origin.name, "input": custom_input(call.arguments)},
        }
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


CHAT = Surface(ChatCompletionRequest, "chatcmpl-", ChatWriter)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await serve(request, CHAT)
