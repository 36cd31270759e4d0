"""Split a chat completion's text stream into reasoning, answer text and tool calls.

A small state machine fed with the text deltas the engine produces (stop strings already cut):

    text ──<think>──▶ reasoning ──</think>──▶ text ──<tool_call>──▶ tool ──</tool_call>──▶ text

Markers may arrive split across deltas, so any tail that could begin a marker is held back
until the next delta decides. Whitespace next to a marker (the "\\n\\n" after </think>, the
newlines between tool calls) is layout, not content, and is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxd.worker.engine.stops import held_tail_len

TEXT, REASONING, TOOL = "text", "reasoning", "tool"
TOOL_PART = "tool_part"  # a tool-call block's text so far, as it comes (tool_parts=True)


@dataclass
class Piece:
    """A run of output of one kind; for TOOL, the whole text between the markers (the
    TOOL_PART pieces before it are that text in the pieces it came in)."""

    kind: str
    text: str


class OutputSplitter:
    """Streaming splitter. `think` and `tool` are (start, end) marker pairs, or None."""

    def __init__(
        self,
        think: tuple[str, str] | None = None,
        tool: tuple[str, str] | None = None,
        in_reasoning: bool = False,
        think_first_only: bool = False,
        tool_parts: bool = False,
    ):
        self._think = think
        # think_first_only: a reasoning block opens only before any answer text (an answer a
        # grammar constrains may spell one first; a marker later in it is its own text)
        self._think_first_only = think_first_only
        self._tool = tool
        self._tool_parts = tool_parts  # also hand out a block's text as it comes
        self.state = REASONING if in_reasoning and think else TEXT
        self._buf = ""  # text not yet classified (may hold the start of a marker)
        self._ws = ""  # trailing whitespace held until we know it is not layout
        self._tool_text = ""
        self._after_marker = self.state == REASONING
        self.saw_marker = self.state == REASONING
        self._said_text = False

    def feed(self, delta: str) -> list[Piece]:
        """Classify `delta`; returns the pieces that are now certain."""
        self._buf += delta
        out: list[Piece] = []
        while True:
            marker, at = self._next_marker()
            if marker is None:
                keep = held_tail_len(self._buf, self._markers())
                self._emit(self._buf[: len(self._buf) - keep], out)
                self._buf = self._buf[len(self._buf) - keep :]
                return out
            self._emit(self._buf[:at], out)
            self._buf = self._buf[at + len(marker) :]
            self._switch(marker, out)

    def finish(self) -> list[Piece]:
        """The stream ended: flush what was held (an unfinished tool call stays text)."""
        out: list[Piece] = []
        self._emit(self._buf, out)
        self._buf = ""
        if self.state == TOOL:
            assert self._tool is not None  # TOOL is entered only through the tool marker
            out.append(Piece(TEXT, self._tool[0] + self._tool_text))
            self._tool_text = ""
            self.state = TEXT
        if self._ws and not self.saw_marker:
            out.append(Piece(self.state, self._ws))
        self._ws = ""
        return out

    # -- internals ------------------------------------------------------------------------
    def _markers(self) -> list[str]:
        if self.state == REASONING:
            assert self._think is not None  # REASONING is entered only with a think pair
            return [self._think[1]]
        if self.state == TOOL:
            assert self._tool is not None  # TOOL is entered only through the tool marker
            return [self._tool[1]]
        think = None if self._think_first_only and self._said_text else self._think
        return [pair[0] for pair in (think, self._tool) if pair]

    def _next_marker(self) -> tuple[str | None, int]:
        best: tuple[str | None, int] = (None, -1)
        for m in self._markers():
            at = self._buf.find(m)
            if at >= 0 and (best[0] is None or at < best[1]):
                best = (m, at)
        return best

    def _emit(self, text: str, out: list[Piece]) -> None:
        if not text:
            return
        if self.state == TOOL:
            self._tool_text += text
            if self._tool_parts:
                out.append(Piece(TOOL_PART, text))
            return
        text = self._ws + text
        self._ws = ""
        if self._after_marker:
            text = text.lstrip()
            if not text:
                return
            self._after_marker = False
        body = text.rstrip()
        self._ws = text[len(body) :]
        if body:
            out.append(Piece(self.state, body))
            self._said_text = self._said_text or self.state == TEXT

    def _switch(self, marker: str, out: list[Piece]) -> None:
        self._ws = ""  # whitespace before a marker is layout
        self.saw_marker = True
        if self.state == TOOL:
            out.append(Piece(TOOL, self._tool_text))
            self._tool_text = ""
            self.state = TEXT
        elif self.state == REASONING:
            self.state = TEXT
        elif self._think and marker == self._think[0]:
            self.state = REASONING
        else:
            self.state = TOOL
        self._after_marker = True
