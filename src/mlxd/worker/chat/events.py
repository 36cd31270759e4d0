"""What a run yields, and how the engine's events become it.

Every API surface prints the same typed output: `Delta` (reasoning or answer text, with logprob
entries), `ToolCalls` (parsed calls), the parts of a call as it is written (`ToolCallStart`,
`ToolCallArgs`, and `ToolCallCut` when it turns out no call), `Keepalive` (nothing for a
while: time for a keep-alive) and finally `Done`. `ChatOutput` reads a chat's text (stop
strings the API names, reasoning, tool calls); `RawOutput` passes a plain completion's text
through as the engine made it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mlxd.shared.chat_job import ChatJob
from mlxd.shared.errors import MlxdError
from mlxd.worker.chat.generation import Generation
from mlxd.worker.chat.output import TEXT, TOOL, TOOL_PART, OutputSplitter
from mlxd.worker.chat.tool_calls import ToolCall, markers, new_call_id, parse_block, streamable
from mlxd.worker.chat.tool_stream import CallStream
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
class ToolCallStart:
    """A call is being written: its id and name are known, its arguments follow."""

    index: int
    id: str
    name: str


@dataclass
class ToolCallArgs:
    """The next fragment of a started call's arguments; the fragments of a call joined are
    the `arguments` of its ToolCall (tool_stream.py)."""

    index: int
    text: str


@dataclass
class ToolCallCut:
    """A started call is no call after all (cut short, or its block does not parse): its
    text follows as a Delta, as a non-streamed answer has it."""

    index: int


CallPart = ToolCallStart | ToolCallArgs | ToolCallCut


@dataclass
class Keepalive:
    pass


class QuietTicks:
    """When a stream owes its client something: `interval_s` passed since it last had output
    (`touch()`); `due()` says so once and starts the interval again. The run owes a Keepalive
    although the engine is busy (a call held until its block ends, or an Ollama stream that
    gets calls whole, yields nothing while tokens come); api/sse.Heartbeat, a protocol event."""

    SLACK_S = 0.0  # how early a tick may land and still count (sse.Heartbeat's wake-ups)

    def __init__(self, interval_s: float, clock=time.monotonic):
        self.interval_s = interval_s
        self._clock = clock
        self._last = clock()

    def touch(self) -> None:
        self._last = self._clock()

    def due(self) -> bool:
        if self._clock() - self._last < self.interval_s - self.SLACK_S:
            return False
        self.touch()
        return True


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


Output = list[Delta | ToolCalls | CallPart]


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
        self.split = OutputSplitter(
            think, tool_markers, in_reasoning, think_first_only=constrained, tool_parts=True
        )
        self.stops = StopScanner(stops)
        self.n_calls = 0  # indexes given out (a cut call keeps its index)
        self.n_whole = 0  # calls that ended whole
        self._streams = bool(self.tools) and streamable(tokenizer)
        self._custom = {name for name, o in job.tool_origins.items() if o.custom}
        self._call: CallStream | None = None  # the block being written
        self._call_id = ""

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
            if p.kind == TOOL_PART:
                out += self._call_part(p.text)
                continue
            if p.kind == TOOL:
                out += self._call_end(p.text)
                continue
            if self._call is not None:  # the stream ended inside a block: it stays text
                out += self._cut()
            out.append(Delta(p.kind, p.text, lps))
            lps = None
        if lps:
            out.append(Delta(TEXT, "", lps))
        return out, ending

    def _call_part(self, text: str) -> Output:
        """A block's text as it comes: the call's start once its name is read, then its
        arguments in fragments (a custom tool's call goes out whole: its input is text)."""
        if self._call is None:
            self._call = CallStream(lambda name: self._streams and name not in self._custom)
        out: Output = []
        for kind, value in self._call.feed(text):
            if kind == "name":  # the call takes the next index, kept if it is cut
                self._call_id = new_call_id()
                out.append(ToolCallStart(self.n_calls, self._call_id, value))
                self.n_calls += 1
            else:
                out.append(ToolCallArgs(self.n_calls - 1, value))
        return out

    def _call_end(self, text: str) -> Output:
        call, self._call = self._call, None
        begun = call is not None and call.begun
        first = self.n_calls - 1 if begun else self.n_calls
        calls = parse_block(self.tok, text, self.tools, first)
        if calls is None or (begun and len(calls) != 1):  # not a call after all: text
            start, end = markers(self.tok)
            cut: Output = [ToolCallCut(first)] if begun else []
            return [*cut, Delta(TEXT, start + text + end)]
        if call is not None and begun:
            calls[0].id, calls[0].streamed = self._call_id, True
            calls[0].arguments = call.final_arguments(calls[0].arguments)
        else:
            self.n_calls += len(calls)
        self.n_whole += len(calls)
        return [ToolCalls(calls)]

    def _cut(self) -> Output:
        call, self._call = self._call, None
        return [ToolCallCut(self.n_calls - 1)] if call is not None and call.begun else []

    def done(self, finish: str | None, tokens: int) -> Done:
        if self.stops.matched is not None:  # a running row is cancelled when the run ends
            return Done("stop", tokens, stop_sequence=self.stops.matched)
        if finish == "stop" and self.n_whole:
            return Done("tool_calls", tokens)
        return Done(finish or "stop", tokens)


class RawOutput:
    """A plain completion's text: one Delta per engine event, as it came."""

    def feed(self, ev: Event) -> tuple[Output, bool]:
        ending = ev.finish_reason is not None
        return [Delta(TEXT, ev.text, ev.logprobs, last=ending)], ending

    def done(self, finish: str | None, tokens: int) -> Done:
        return Done(finish or "stop", tokens)
