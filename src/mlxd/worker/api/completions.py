"""POST /v1/completions on the worker's socket: the legacy completions writer."""

from __future__ import annotations

import time

from aiohttp import web

from mlxd.shared.errors import MlxdError
from mlxd.shared.wire.completions import Completion, CompletionChoice, CompletionRequest
from mlxd.shared.wire.openai_out import Usage
from mlxd.worker.api import sse
from mlxd.worker.api.driver import Surface, Writer, serve
from mlxd.worker.api.openai import openai_usage, stream_error
from mlxd.worker.chat.events import Collected, Delta, Done, TokenUsage
from mlxd.worker.chat.output import TEXT
from mlxd.worker.engine.step.logprobs import completion_logprobs


class CompletionWriter(Writer):
    """Text chunks: the echoed prompt first (if asked), then the text as it comes; the last
    text and the finish reason share one chunk."""

    def __init__(self, req: CompletionRequest, run, rid: str):
        super().__init__(req, run, rid)
        self.created = int(time.time())
        self.offset = len(run.echo)  # where the next text starts, for logprob text offsets
        self.last: Delta | None = None  # the row's final text, sent with the finish reason

    def _chunk(self, text: str, finish=None, logprobs=None, usage: Usage | None = None) -> bytes:
        choices = (
            [] if usage else [CompletionChoice(text=text, finish_reason=finish, logprobs=logprobs)]
        )
        return sse.data(
            Completion(
                id=self.rid,
                created=self.created,
                model=self.run.m.model_id,
                choices=choices,
                usage=usage,
            )
        )

    def _logprobs(self, d: Delta) -> dict | None:
        lp = (
            completion_logprobs(self.run.m.tokenizer, d.logprobs, self.offset)
            if d.logprobs
            else None
        )
        self.offset += len(d.text)
        return lp

    def open(self) -> bytes:
        return self._chunk(self.run.echo) if self.run.echo else b""

    def delta(self, d: Delta) -> bytes:
        if d.last:
            self.last = d
            return b""
        lp = self._logprobs(d)
        return self._chunk(d.text, logprobs=lp) if d.text or lp else b""

    def done(self, done: Done, usage: TokenUsage) -> bytes:
        last = self.last or Delta(TEXT, "")
        out = self._chunk(last.text, done.finish_reason, self._logprobs(last))
        if self.req.include_usage:
            out += self._chunk("", usage=openai_usage(usage))
        return out + sse.DONE

    def error(self, err: MlxdError, usage: TokenUsage) -> bytes:
        return stream_error(err)

    def body(self, out: Collected, usage: TokenUsage) -> Completion:
        run = self.run
        choice = CompletionChoice(
            text=run.echo + out.text,
            finish_reason=out.done.finish_reason,
            logprobs=completion_logprobs(run.m.tokenizer, out.logprobs, len(run.echo))
            if run.params.logprobs
            else None,
        )
        return Completion(
            id=self.rid, model=run.m.model_id, choices=[choice], usage=openai_usage(usage)
        )


COMPLETIONS = Surface(CompletionRequest, "cmpl-", CompletionWriter)


async def completions(request: web.Request) -> web.StreamResponse:
    return await serve(request, COMPLETIONS)
