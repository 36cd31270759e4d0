"""Run one ChatJob and yield typed output (events.py): the generation path of every surface.

A chat is rendered through the model's template and its output read for stop strings,
reasoning and tool calls; a job with a `RawPrompt` (legacy completions) is tokenized as given
and its text passed through. Both then share the Generation, the keep-alive ticks, the
progress the access log reads and the non-streamed collection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace

from mlxd.shared.chat_job import ChatJob, refuse_images
from mlxd.shared.errors import Unavailable
from mlxd.shared.structured_output import GuidedSpec
from mlxd.worker.cache.keys import make_cache_key, stable_boundary, suffix_boundary
from mlxd.worker.chat.events import (
    CallPart,
    ChatOutput,
    Collected,
    Delta,
    Done,
    Keepalive,
    QuietTicks,
    RawOutput,
    RowProgress,
    TokenUsage,
    ToolCalls,
)
from mlxd.worker.chat.generation import Generation
from mlxd.worker.chat.output import REASONING
from mlxd.worker.chat.prompts import (
    ChatPrompt,
    check_params,
    completion_prompt,
    prepare_messages,
    render_job,
    resolve_params,
)
from mlxd.worker.chat.reply_ids import splice_replies
from mlxd.worker.chat.state import WorkerState, adapter_ns
from mlxd.worker.chat.think_budget import think_budget
from mlxd.worker.chat.tool_calls import ToolCall, forced_call_spec
from mlxd.worker.chat.vision import with_images
from mlxd.worker.grammar.processor import (
    GuidedProcessor,
    GuidedUnavailable,
    compile_spec,
    row_processors,
    warning_header,
)

log = logging.getLogger("mlxd.worker.chat")

KEEPALIVE_S = 5.0
# A worker group's followers could not run a grammar compiled on rank 0 (worker/group/), nor
# any other processor of a row's own.
NO_GRAMMAR = "a model served by a worker group cannot enforce it"
SUFFIX_WARNING = warning_header(
    "suffix", "this server does not fill in the middle", "it was ignored"
)


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
        self.prompt: ChatPrompt | None = None  # a chat's rendered conversation
        self.echo = ""  # a raw prompt's text, when the job asks for it back
        self.gen: Generation | None = None
        self.completion_tokens = 0
        self.first_event_ns: int | None = None  # when the engine's first event came (timings)
        self._output: ChatOutput | RawOutput | None = None
        # The prompt-cache namespace: an adapter's rows never meet the base's entries.
        self.ns = adapter_ns(state, self.engine, job.adapter)

    @classmethod
    async def prepare(cls, state: WorkerState, job: ChatJob, rid: str) -> ChatRun:
        run = cls(state, job, rid)
        await (run._prepare_raw() if job.raw is not None else run._prepare_chat())
        return run

    async def _prepare_chat(self) -> None:
        m, job = self.m, self.job
        if job.images and self.state.vision is None:  # before any grammar compiles
            refuse_images(job, self.state.config.model_id)
        check_params(m, job.params)  # a bad parameter is a 400 before any grammar compiles
        job.messages = prepare_messages(m, job.messages, self.state.config.strip_attribution_lines)
        spec = job.guided
        forced = forced_call_spec(m.tokenizer, job)  # compiled below, with any other spec
        if forced is None and job.tool_mode in ("required", "function") and job.tools:
            self._warn(
                "tool_choice",
                "no grammar for this model's tool-call format",
                "the model was left to choose",
            )
        spec = forced or spec
        compiled = None
        if spec is not None and not self.engine.grammars:
            self._degrade(spec, NO_GRAMMAR)
        elif spec is not None:
            try:
                compiled = await compile_spec(m, spec, self.state.config)
            except GuidedUnavailable as exc:
                self._degrade(spec, str(exc))
        # Rendering and tokenizing a long conversation takes tens of ms (42.7k tokens: 34 ms
        # to encode on a 2-core CPU); in a thread (the tokenizer lets go of the GIL), the
        # event loop keeps every other stream moving and arrivals tokenize side by side.
        self.prompt = await asyncio.to_thread(render_job, m, job, self.state.config.enable_thinking)
        if self.prompt.warning:  # tools described as text: the template has no format
            job.warnings.append(self.prompt.warning)
        images = None  # the images as the vision tower takes them (worker/vision/)
        if job.images:
            self.prompt, images = await with_images(self.state, job, self.prompt)
        # The replies it re-sends get the ids the model generated back (cache/replies.py).
        spliced = splice_replies(self.state, m.tokenizer, job.messages, self.prompt.ids, self.ns)
        ids = spliced.ids
        params = resolve_params(m, job.params, len(ids), job.surface)
        # The engine cuts stop strings itself; when the API must name the one that matched,
        # they are cut here instead (the row is then cancelled as the block ends).
        stops = params.stop if job.report_stop else ()
        constrained = compiled is not None  # a grammar holds the output (worker/grammar)
        self._output = ChatOutput(m.tokenizer, job, self.prompt.in_reasoning, stops, constrained)
        if job.report_stop:
            params = replace(params, stop=())
        processors: list = []  # a row's logits processors, as Submission holds them
        if compiled is not None:
            after = m.tokenizer.think_end_tokens if self.prompt.in_reasoning else None
            processors.append(GuidedProcessor(*compiled, after=after))
        off = self.prompt.kwargs.get("enable_thinking") is False
        budget = think_budget(m.tokenizer, params, self.prompt.in_reasoning, off)
        if budget is not None and not self.engine.grammars:
            job.warnings.append(warning_header("thinking budget", NO_GRAMMAR, "it was ignored"))
        elif budget is not None:
            processors.append(budget)
        boundary = 0
        if not self.engine.trimmable:
            p = self.prompt
            if images is None:  # a second render and encode: off the loop too
                at = await asyncio.to_thread(
                    stable_boundary, m.tokenizer, job.messages, p.kwargs, p.ids, p.text
                )
            else:  # the ids came through the processor: find the primer's tokens at the end
                at = suffix_boundary(m.tokenizer, job.messages, p.kwargs, p.text, p.ids)
            boundary = spliced.shift(at)
        key = await make_cache_key(self.state, ids, job.session, boundary, ns=self.ns)
        key.replies = spliced.replies
        self.gen = Generation(
            self.engine,
            self.rid,
            ids,
            params,
            processors=processors,
            cache_key=key,
            adapter=job.adapter,
            images=images,
        )
        self.params = params

    async def _prepare_raw(self) -> None:
        """A completion of the prompt as given: no template, no output parsing."""
        m, job, raw = self.m, self.job, self.job.raw
        assert raw is not None  # prepare() comes here only for a raw prompt
        ids = completion_prompt(m, raw.value)
        self.params = resolve_params(m, job.params, len(ids), job.surface, raw=True)
        self.echo = m.tokenizer.decode(ids) if raw.echo else ""
        key = await make_cache_key(self.state, ids, job.session, ns=self.ns)
        guided = job.guided if self.engine.grammars else None
        processors, warning = await row_processors(m, guided, self.state.config)
        if job.guided is not None and guided is None:
            warning = warning_header(job.guided.param, NO_GRAMMAR, "the output is not constrained")
        if warning:
            job.warnings.append(warning)
        if raw.suffix:  # no fill-in-the-middle here: say so, as for other ignored constraints
            job.warnings.append(SUFFIX_WARNING)
        self._output = RawOutput()
        self.gen = Generation(
            self.engine,
            self.rid,
            ids,
            self.params,
            processors=processors,
            cache_key=key,
            adapter=job.adapter,
        )

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

    def _generation(self) -> Generation:
        assert self.gen is not None  # set by prepare(), the only way a run is made
        return self.gen

    def usage(self, done: Done) -> TokenUsage:
        """The row's token counts (cache hits are known once its first event arrived)."""
        gen = self._generation()
        return TokenUsage(gen.prompt_tokens, done.completion_tokens, gen.cached_tokens)

    def __enter__(self) -> ChatRun:
        self._generation().__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._generation().__exit__(*exc)

    async def events(
        self, tool_parts: bool = False
    ) -> AsyncIterator[Delta | ToolCalls | CallPart | Keepalive | Done]:
        """The run's output; `tool_parts`: a call's parts as it is written, too."""
        gen, output = self._generation(), self._output
        assert output is not None  # set by prepare() with the generation
        ticks = QuietTicks(KEEPALIVE_S, self.state.clock)
        while True:
            ev = await gen.next(KEEPALIVE_S)
            if ev is None or ticks.due():
                ticks.touch()
                yield Keepalive()
            if ev is None:
                continue
            self.completion_tokens = ev.completion_tokens  # for the access log
            if self.first_event_ns is None:
                self.first_event_ns = time.monotonic_ns()
            if ev.error is not None:
                yield Done("error", ev.completion_tokens, error=ev.error)
                return
            out, ending = output.feed(ev)
            for item in out:
                if tool_parts or not isinstance(item, CallPart):
                    ticks.touch()
                    yield item
            if ending:
                yield output.done(ev.finish_reason, ev.completion_tokens)
                return

    async def collect(self) -> Collected:
        """The whole completion; raises the row's error (a 503) if it failed."""
        text: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCall] = []
        logprobs: list[dict] = []
        done: Done | None = None
        async for ev in self.events():
            if isinstance(ev, Delta):
                (reasoning if ev.kind == REASONING else text).append(ev.text)
                logprobs.extend(ev.logprobs or ())
            elif isinstance(ev, ToolCalls):
                calls.extend(ev.calls)
            elif isinstance(ev, Done):
                done = ev
        assert done is not None  # events() ends only after its Done
        if done.error is not None:
            err = done.error
            raise err if isinstance(err, Unavailable) else Unavailable(err.message)
        return Collected(
            done=done,
            text="".join(text),
            reasoning="".join(reasoning),
            calls=calls,
            logprobs=logprobs,
        )
