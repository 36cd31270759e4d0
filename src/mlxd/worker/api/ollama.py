"""POST /api/chat and /api/generate on the worker's socket: the Ollama writers (NDJSON).

Ollama streams one JSON object a line and ends with a line carrying `done: true`, the finish
reason and its token counts and durations (nanoseconds). The driver's first-token marker goes
in front of the first generated line like on every surface; the supervisor's proxy cuts it.
"""

from __future__ import annotations

import time

import orjson
from aiohttp import web
from pydantic import BaseModel

from mlxd.shared.errors import BadRequest, MlxdError, ollama_body
from mlxd.shared.wire.ollama import ChatRequest, GenerateRequest
from mlxd.shared.wire.ollama_answers import ChatAnswer, GenerateAnswer, MessageOut, ToolCallOut
from mlxd.shared.wire.safe_json import dumps
from mlxd.worker.api.driver import Surface, Writer, serve
from mlxd.worker.chat.events import Collected, Delta, Done, TokenUsage
from mlxd.worker.chat.output import REASONING
from mlxd.worker.chat.tool_calls import ToolCall
from mlxd.worker.engine.step.logprobs import chat_logprobs

NDJSON = "application/x-ndjson"
# The engine's finish reasons in Ollama's words (a tool call ends a turn like a stop does).
DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}


def _line(body: BaseModel) -> bytes:
    return dumps(body.model_dump()) + b"\n"


def _tool_call(call: ToolCall) -> ToolCallOut:
    return ToolCallOut(
        id=call.id, function={"index": call.index, "name": call.name, "arguments": call.input}
    )


class _OllamaWriter(Writer):
    """What both Ollama writers share: NDJSON lines, the final counts, errors as a line."""

    media_type = NDJSON

    def __init__(self, req: ChatRequest | GenerateRequest, run, rid: str):
        super().__init__(req, run, rid)
        if req.think and not run.m.tokenizer.has_thinking:  # Ollama refuses it the same way
            raise BadRequest(f"'{req.model}' does not support thinking", param="think")
        self.t0 = time.monotonic_ns()

    def keepalive(self, heartbeat_due: bool) -> bytes:
        # NDJSON has no comment line, and Ollama sends nothing while a prompt is read; once
        # tokens come (a tool call being written goes out whole), a quiet stream gets an
        # empty line of output every heartbeat, which clients add as nothing.
        if heartbeat_due and self.run.first_event_ns is not None:
            return _line(self._empty())
        return b""

    def _empty(self) -> BaseModel:
        raise NotImplementedError

    def error(self, err: MlxdError, usage: TokenUsage) -> bytes:
        return orjson.dumps(ollama_body(err)) + b"\n"

    def _logprobs(self, entries: list[dict] | None) -> list[dict] | None:
        if not entries or not self.run.params.logprobs:
            return None
        return chat_logprobs(self.run.m.tokenizer, entries)["content"]

    def _final(self, answer, finish: str, usage: TokenUsage):
        now = time.monotonic_ns()
        first = self.run.first_event_ns or now  # the prompt was read by the first event
        answer.done = True
        answer.done_reason = DONE_REASONS.get(finish, finish)
        answer.total_duration = now - self.t0
        answer.load_duration = 0  # a model loads before its worker takes requests
        answer.prompt_eval_count = usage.prompt
        answer.prompt_eval_duration = first - self.t0
        answer.eval_count = usage.completion
        answer.eval_duration = now - first
        return answer


class ChatWriter(_OllamaWriter):
    """/api/chat: `message` fragments (content, thinking, tool_calls), then the final line."""

    def delta(self, d: Delta) -> bytes:
        if not d.text and not d.logprobs:
            return b""
        msg = MessageOut(thinking=d.text) if d.kind == REASONING else MessageOut(content=d.text)
        lps = self._logprobs(d.logprobs)
        return _line(ChatAnswer(model=self.req.model, message=msg, logprobs=lps))

    def _empty(self) -> ChatAnswer:
        return ChatAnswer(model=self.req.model, message=MessageOut())

    def tool_calls(self, calls: list[ToolCall]) -> bytes:
        msg = MessageOut(tool_calls=[_tool_call(c) for c in calls])
        return _line(ChatAnswer(model=self.req.model, message=msg))

    def done(self, done: Done, usage: TokenUsage) -> bytes:
        return _line(self._final(ChatAnswer(model=self.req.model), done.finish_reason, usage))

    def body(self, out: Collected, usage: TokenUsage) -> ChatAnswer:
        msg = MessageOut(
            content=out.text,
            thinking=out.reasoning or None,
            tool_calls=[_tool_call(c) for c in out.calls] or None,
        )
        lps = self._logprobs(out.logprobs)
        answer = ChatAnswer(model=self.req.model, message=msg, logprobs=lps)
        return self._final(answer, out.done.finish_reason, usage)


class GenerateWriter(_OllamaWriter):
    """/api/generate: `response` (and `thinking`) fragments, then the final line."""

    def delta(self, d: Delta) -> bytes:
        if not d.text and not d.logprobs:
            return b""
        text = {"thinking": d.text} if d.kind == REASONING else {"response": d.text}
        answer = GenerateAnswer(model=self.req.model, logprobs=self._logprobs(d.logprobs), **text)
        return _line(answer)

    def _empty(self) -> GenerateAnswer:
        return GenerateAnswer(model=self.req.model, response="")

    def done(self, done: Done, usage: TokenUsage) -> bytes:
        return _line(self._final(GenerateAnswer(model=self.req.model), done.finish_reason, usage))

    def body(self, out: Collected, usage: TokenUsage) -> GenerateAnswer:
        answer = GenerateAnswer(
            model=self.req.model,
            response=out.text,
            thinking=out.reasoning or None,
            logprobs=self._logprobs(out.logprobs),
        )
        return self._final(answer, out.done.finish_reason, usage)


CHAT = Surface(ChatRequest, "ollama-chat-", ChatWriter)
GENERATE = Surface(GenerateRequest, "ollama-gen-", GenerateWriter)


async def chat(request: web.Request) -> web.StreamResponse:
    return await serve(request, CHAT)


async def generate(request: web.Request) -> web.StreamResponse:
    return await serve(request, GENERATE)
