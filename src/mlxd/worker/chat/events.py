"""What a run yields, and how the engine's events become it.

Every API surface prints the same typed output: `Delta` (reasoning or answer text, with logprob
entries), `ToolCalls` (parsed calls), `Keepalive` (nothing for a while: time for a keep-alive)
and finally `Done`. `ChatOutput` reads a chat's text (stop strings the API names, reasoning,
tool calls); `RawOutput` passes a plain completion's text through as the engine made it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlxd.shared.chat_job import ChatJob
from mlxd.shared.errors import MlxdError
from mlxd.worker.chat.generation import Generation
from mlxd.worker.chat.output import TEXT, TOOL, OutputSplitter
from mlxd.worker.chat.tool_calls import ToolCall, markers, parse_block
from mlxd.worker.engine.rows import Event
from mlxd.worker.engine.stops import StopScanner


@dataclass
class Delta:
    kind: str  # "text" or "reasoning"
    text: str
    logprobs: list[dict] | None = None
    last: bool = False  # from the engine event that ended the row (RawOutput sets it)


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


@dataclass(frozen=True)
class TokenUsage:
    """Token counts in no API's words; each surface's writer builds its own usage from them."""

    prompt: int
    completion: int
    cached: int  # prompt tokens served from the prompt cache


@dataclass
class Collected:
    """A whole completion, for the non-streaming responses."""

    done: Done  # how it ended
    text: str = ""
    reasoning: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[dict] = field(default_factory=list)


@dataclass
class RowProgress:
    """How far a request got, for the access log's line when the client leaves early.

    `ChatRun` has the same attributes.
    """

    gen: Generation | None = None
    completion_tokens: int = 0

    @property
    def prompt_done(self) -> int:
        """Prompt tokens processed: all of them once a token came out, else those the prompt
        cache supplied plus those prefilled so far."""
        if self.gen is None:
            return 0
        return self.gen.prompt_tokens if self.completion_tokens else self.gen.prompt_done


Output = list[Delta | ToolCalls]


class ChatOutput:
    """A chat's text: cut at stop strings the API names, split into reasoning, answer text
    and tool calls."""

    def __init__(
        self,
        tokenizer,
        job: ChatJob,
        in_reasoning: bool,
        stops: tuple[str, ...],
        constrained: bool = False,
    ):
        self.tok = tokenizer
        self.tools = job.rendered_tools
        think = (tokenizer.think_start, tokenizer.think_end) if tokenizer.has_thinking else None
        tool_markers = markers(tokenizer) if self.tools else None
        # A grammar's answer may spell a reasoning block first; a think marker later in it (a
        # JSON string may hold "<think>") is the answer's own text.
        self.split = OutputSplitter(think, tool_markers, in_reasoning, think_first_only=constrained)
        self.stops = StopScanner(stops)
        self.n_calls = 0

    def feed(self, ev: Event) -> tuple[Output, bool]:
        """What `ev` adds, and whether the row ends with it."""
        text = self.stops.feed(ev.text)
        ending = ev.finish_reason is not None or self.stops.matched is not None
        if ending:
            text += self.stops.finish()
        pieces = self.split.feed(text) + (self.split.finish() if ending else [])
        out: Output = []
        lps = ev.logprobs
        for p in pieces:
            if p.kind == TOOL:
                calls = parse_block(self.tok, p.text, self.tools, self.n_calls)
                if calls is None:  # not a call after all: keep it as text
                    start, end = markers(self.tok)
                    out.append(Delta(TEXT, start + p.text + end))
                else:
                    self.n_calls += len(calls)
                    out.append(ToolCalls(calls))
                continue
            out.append(Delta(p.kind, p.text, lps))
            lps = None
        if lps:
            out.append(Delta(TEXT, "", lps))
        return out, ending

    def done(self, finish: str | None, tokens: int) -> Done:
        if self.stops.matched is not None:  # a running row is cancelled when the run ends
            return Done("stop", tokens, stop_sequence=self.stops.matched)
        if finish == "stop" and self.n_calls:
            return Done("tool_calls", tokens)
        return Done(finish or "stop", tokens)


class RawOutput:
    """A plain completion's text: one Delta per engine event, as it came."""

    def feed(self, ev: Event) -> tuple[Output, bool]:
        ending = ev.finish_reason is not None
        return [Delta(TEXT, ev.text, ev.logprobs, last=ending)], ending

    def done(self, finish: str | None, tokens: int) -> Done:
        return Done(finish or "stop", tokens)
