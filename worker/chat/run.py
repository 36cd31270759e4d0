"""Run one ChatJob and yield typed output: the generation path every chat surface shares.

OpenAI chat, Anthropic Messages and the Responses API differ only in how they print these
events: `Delta` (reasoning or answer text, with logprob entries), `ToolCalls` (parsed calls),
`Keepalive` (nothing for a while: time for an SSE comment) and finally `Done`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from mlxd.shared.chat_job import ChatJob, fold_system_messages, late_system_indexes
from mlxd.shared.errors import BadRequest, MlxdError, Unavailable
from mlxd.shared.structured_output import GuidedSpec
from mlxd.worker.api.generation import Generation
from mlxd.worker.cache.keys import make_cache_key, stable_boundary
from mlxd.worker.chat.output import REASONING, TEXT, OutputSplitter, StopScanner
from mlxd.worker.chat.prompts import ChatPrompt, chat_prompt, check_params, resolve_params
from mlxd.worker.chat.tool_calls import ToolCall, forced_call_spec, markers, parse_block
from mlxd.worker.grammar.processor import (
    GuidedProcessor,
    GuidedUnavailable,
    compile_spec,
    warning_header,
)
from mlxd.worker.state import WorkerState

log = logging.getLogger("mlxd.worker.chat")

KEEPALIVE_S = 5.0


@dataclass
class Delta:
    kind: str  # "text" or "reasoning"
    text: str
    logprobs: list[dict] | None = None


@dataclass
class ToolCalls:
    calls: list[ToolCall]


@dataclass
class Keepalive:
    pass


@dataclass
class Done:
    finish_reason: str  # stop | length | tool_calls | error
    completion_tokens: int
    stop_sequence: str | None = None
    error: MlxdError | None = None


@dataclass
class RowProgress:
    """How far a request got, for the access log's line when the client leaves early.

    `ChatRun` has the same two attributes; plain completions use this.
    """

    gen: Generation | None = None
    completion_tokens: int = 0

    @property
    def prompt_done(self) -> int:
        """Prompt tokens known to be processed: all of them once a token came out, else
        only those the prompt cache supplied (prefill progress is the engine's)."""
        if self.gen is None:
            return 0
        return self.gen.prompt_tokens if self.completion_tokens else self.gen.cached_tokens


@dataclass
class Collected:
    """A whole completion, for the non-streaming responses."""

    text: str = ""
    reasoning: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[dict] = field(default_factory=list)
    done: Done | None = None


class ChatRun:
    """Prepare with `await ChatRun.prepare(...)`, then `with run:` and iterate `run.events()`.

    Leaving the block early cancels the row. `warning` is set when a structured-output
    constraint could not be compiled and was asked for in the system prompt instead.
    """

    def __init__(self, state: WorkerState, job: ChatJob, rid: str):
        self.state = state
        self.m, self.engine = state.ready()
        self.job = job
        self.rid = rid
        self.warning: str | None = None
        self.prompt: ChatPrompt | None = None
        self.gen: Generation | None = None
        self.completion_tokens = 0

    @classmethod
    async def prepare(cls, state: WorkerState, job: ChatJob, rid: str) -> ChatRun:
        run = cls(state, job, rid)
        await run._prepare()
        return run

    async def _prepare(self) -> None:
        m, job = self.m, self.job
        check_params(m, job.params)  # a bad parameter is a 400 before any grammar compiles
        spec = job.guided
        try:
            forced = forced_call_spec(m.tokenizer, job)
        except ValueError as exc:  # a parameters schema that outlines-core cannot express
            forced = None
            self._warn("tool_choice", str(exc), "the model was left to choose")
        if forced is None and job.tool_mode in ("required", "function") and job.tools:
            self._warn(
                "tool_choice",
                "no grammar for this model's tool-call format",
                "the model was left to choose",
            )
        spec = forced or spec
        compiled = None
        if spec is not None:
            try:
                compiled = await compile_spec(m, spec, self.state.config)
            except GuidedUnavailable as exc:
                self._degrade(spec, str(exc))
        self.prompt = render_job(m, job, self.state.config.enable_thinking)
        if self.prompt.warning:  # tools described as text: the template has no format
            job.warnings.append(self.prompt.warning)
        ids = self.prompt.ids
        params = resolve_params(m, job.params, len(ids), job.surface)
        # The engine cuts stop strings itself; when the API must name the one that matched,
        # they are cut here instead (the row is then cancelled as the block ends).
        self._stops = StopScanner(params.stop if job.report_stop else ())
        if job.report_stop:
            params = replace(params, stop=())
        processors = []
        if compiled is not None:
            after = m.tokenizer.think_end_tokens if self.prompt.in_reasoning else None
            processors.append(GuidedProcessor(*compiled, after=after))
        boundary = (
            0
            if self.engine.trimmable
            else stable_boundary(m.tokenizer, job.messages, self.prompt.kwargs, ids)
        )
        key = await make_cache_key(self.state, ids, job.session, boundary)
        self.gen = Generation(
            self.engine, self.rid, ids, params, processors=processors, cache_key=key
        )
        self.params = params

    def _warn(self, param: str, why: str, outcome: str) -> None:
        log.info("cannot enforce %s (%s): %s", param, why, outcome)
        self.warning = warning_header(param, why, outcome)

    def _degrade(self, spec: GuidedSpec, why: str) -> None:
        """Ask in words for what the grammar could not enforce."""
        self._warn(spec.param, why, "it was requested in the system prompt instead")
        msgs = self.job.messages
        if msgs and msgs[0].get("role") == "system":
            msgs[0] = {
                **msgs[0],
                "content": f"{msgs[0].get('content') or ''}\n\n{spec.instruction()}".lstrip(),
            }
        else:
            msgs.insert(0, {"role": "system", "content": spec.instruction()})

    @property
    def headers(self) -> dict[str, str]:
        """`Warning` values (RFC 7234 allows a list): what the request asked for in vain."""
        values = [*self.job.warnings, *([self.warning] if self.warning else [])]
        return {"Warning": ", ".join(values)} if values else {}

    prompt_done = RowProgress.prompt_done

    def __enter__(self) -> ChatRun:
        self.gen.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.gen.__exit__(*exc)

    async def events(self) -> AsyncIterator[Delta | ToolCalls | Keepalive | Done]:
        tok = self.m.tokenizer
        tools = self.job.rendered_tools
        think = (tok.think_start, tok.think_end) if tok.has_thinking else None
        split = OutputSplitter(think, markers(tok) if tools else None, self.prompt.in_reasoning)
        n_calls = 0
        while True:
            ev = await self.gen.next(KEEPALIVE_S)
            if ev is None:
                yield Keepalive()
                continue
            self.completion_tokens = ev.completion_tokens  # for the access log
            if ev.error is not None:
                yield Done("error", ev.completion_tokens, error=ev.error)
                return
            text = self._stops.feed(ev.text)
            ending = ev.finish_reason is not None or self._stops.matched is not None
            if ending:
                text += self._stops.finish()
            pieces = split.feed(text) + (split.finish() if ending else [])
            lps = ev.logprobs
            for p in pieces:
                if p.kind == "tool":
                    calls = parse_block(tok, p.text, tools, n_calls)
                    if calls is None:  # not a call after all: keep it as text
                        start, end = markers(tok)
                        yield Delta(TEXT, start + p.text + end)
                    else:
                        n_calls += len(calls)
                        yield ToolCalls(calls)
                    continue
                yield Delta(p.kind, p.text, lps)
                lps = None
            if lps:
                yield Delta(TEXT, "", lps)
            if ending:
                yield self._done(ev.finish_reason, ev.completion_tokens, n_calls)
                return

    def _done(self, finish: str | None, tokens: int, n_calls: int) -> Done:
        if self._stops.matched is not None:  # a running row is cancelled when the block ends
            return Done("stop", tokens, stop_sequence=self._stops.matched)
        if finish == "stop" and n_calls:
            return Done("tool_calls", tokens)
        return Done(finish or "stop", tokens)

    async def collect(self) -> Collected:
        """The whole completion; raises the row's error (a 503) if it failed."""
        out = Collected()
        text, reasoning = [], []
        async for ev in self.events():
            if isinstance(ev, Delta):
                (reasoning if ev.kind == REASONING else text).append(ev.text)
                out.logprobs.extend(ev.logprobs or ())
            elif isinstance(ev, ToolCalls):
                out.calls.extend(ev.calls)
            elif isinstance(ev, Done):
                out.done = ev
        if out.done.error is not None:
            err = out.done.error
            raise err if isinstance(err, Unavailable) else Unavailable(err.message)
        out.text, out.reasoning = "".join(text), "".join(reasoning)
        return out


def render_job(m, job: ChatJob, enable_thinking: bool | None) -> ChatPrompt:
    """Render `job` through the chat template, keeping every system message's text.

    A system message after the first turn (Claude Code's mid-conversation reminders, a
    Responses `developer` item) stays in place where the template renders it there; where
    the template refuses it, or renders the conversation without its text, it is folded
    into a user turn as a delimited note (`fold_system_messages`).
    """
    late = late_system_indexes(job.messages)
    if late:
        try:
            prompt = chat_prompt(
                m, job.messages, job.rendered_tools, job.template_kwargs, enable_thinking
            )
        except BadRequest:
            prompt = None
        if prompt is not None and all(
            str(job.messages[i].get("content") or "").strip() in prompt.text for i in late
        ):
            return prompt
        log.debug(
            "folding %d later system message(s) into user turns: the template %s",
            len(late),
            "refused them" if prompt is None else "left their text out",
        )
        job.messages = fold_system_messages(job.messages)
    return chat_prompt(m, job.messages, job.rendered_tools, job.template_kwargs, enable_thinking)
