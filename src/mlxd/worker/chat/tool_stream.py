"""A tool call read as the model writes it: its name once known, then its arguments' text.

For the JSON-in-tags format (`{"name": "f", "arguments": {...}}` between the markers, as
Hermes and Qwen write it) the call's head is matched as it grows; once `"arguments": {` has
come, the arguments object's text streams out in fragments. The fragments are the model's own
text, with what a parser would read differently made plain as it passes: whitespace outside
strings dropped (the compact form orjson writes), NaN and ±Infinity as `null` and a lone
surrogate escape as `\\ufffd` (what `safe_json` makes of them). When the whole block parses
to the same value, that text is the call's final `arguments`, so the fragments a client joins
are exactly the arguments of the finished call, streamed or not (`final_arguments`).

Any other shape (a list of calls, keys in another order, arguments as a string) is not
streamed: the call goes out whole when its block ends, as before.
"""

from __future__ import annotations

import json
import math

from mlxd.shared.wire.safe_json import dumps, loads_exact

NEED, FAIL = "need", "fail"
_WS = " \t\n\r"
# The head of a call up to its arguments object; None stands for the name's JSON string.
_HEAD = ("{", '"name"', ":", None, ",", '"arguments"', ":", "{")
# Text before the arguments object longer than this is not a head worth waiting for.
MAX_HEAD_CHARS = 1024
_NON_FINITE = {"NaN": "null", "Infinity": "null", "-Infinity": "null"}


def _string_end(text: str, at: int) -> int:
    """The index after the JSON string opening at `at`, or -1 if it has not closed yet."""
    i = at + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == '"':
            return i + 1
        else:
            i += 1
    return -1


def match_head(text: str) -> tuple[int, str] | str:
    """Where the arguments object opens in `text` and the call's name; NEED while `text`
    could still become such a head, FAIL once it cannot."""
    i, name = 0, ""
    for want in _HEAD:
        while i < len(text) and text[i] in _WS:
            i += 1
        if i == len(text):
            return NEED
        if want is None:
            if text[i] != '"':
                return FAIL
            end = _string_end(text, i)
            if end < 0:
                return NEED
            try:
                name = json.loads(text[i:end])
            except ValueError:
                return FAIL
            i = end
            continue
        got = text[i : i + len(want)]
        if not want.startswith(got):
            return FAIL
        if len(got) < len(want):
            return NEED
        i += len(want)
    return i - 1, name


class ArgsText:
    """The arguments object's text as it comes, made plain (module docstring); `feed`
    returns the new fragment, `complete` once the object closed (the rest is ignored)."""

    def __init__(self) -> None:
        self.text = ""
        self.complete = False
        self._depth = 0
        self._in_string = False
        self._escape = ""  # an escape sequence not yet whole
        self._high = ""  # a high surrogate escape waiting for its low half
        self._word = ""  # a number or literal not yet ended

    def feed(self, text: str) -> str:
        out: list[str] = []
        for ch in text:
            if self.complete:
                break
            if self._in_string:
                self._string_char(ch, out)
            elif ch in _WS:
                self._end_word(out)
            elif ch in '{[,:"}]':
                self._end_word(out)
                out.append(ch)
                self._in_string = ch == '"'
                self._depth += (ch in "{[") - (ch in "}]")
                self.complete = self._depth <= 0
            else:
                self._word += ch
        fragment = "".join(out)
        self.text += fragment
        return fragment

    def _end_word(self, out: list[str]) -> None:
        word, self._word = self._word, ""
        if word:
            out.append(_plain_word(word))

    def _string_char(self, ch: str, out: list[str]) -> None:
        if self._escape:
            self._escape += ch
            if self._escape[1] == "u" and len(self._escape) < 6:
                return
            escape, self._escape = self._escape, ""
            self._escaped(escape, out)
            return
        if self._high:  # anything but another escape leaves the high half alone
            if ch == "\\":
                self._escape = ch
                return
            out.append("\\ufffd")
            self._high = ""
        if ch == "\\":
            self._escape = ch
            return
        out.append(ch)
        self._in_string = ch != '"'

    def _escaped(self, escape: str, out: list[str]) -> None:
        code = _code_unit(escape)
        if self._high:
            high, self._high = self._high, ""
            if code is not None and 0xDC00 <= code <= 0xDFFF:
                out.append(high + escape)
                return
            out.append("\\ufffd")
        if code is not None and 0xD800 <= code <= 0xDBFF:
            self._high = escape
        elif code is not None and 0xDC00 <= code <= 0xDFFF:
            out.append("\\ufffd")
        else:
            out.append(escape)


def _code_unit(escape: str) -> int | None:
    if escape[1] != "u":
        return None
    try:
        return int(escape[2:], 16)
    except ValueError:
        return None


def _plain_word(word: str) -> str:
    if word in _NON_FINITE:
        return _NON_FINITE[word]
    if any(c in word for c in ".eE"):  # a float too big for a double reads as ±Infinity
        try:
            if not math.isfinite(float(word)):
                return "null"
        except ValueError:
            pass
    return word


class CallStream:
    """One tool-call block as it is written: `feed` returns ("name", name) once the head is
    read, then ("args", fragment) pieces; `held` when the block is not one to stream (its
    shape, or `streams(name)` said no)."""

    def __init__(self, streams=lambda name: True) -> None:
        self.name: str | None = None  # set once the call is streaming
        self.args = ArgsText()
        self.held = False
        self._streams = streams  # whether a call to this name is one to stream
        self._head = ""

    @property
    def begun(self) -> bool:
        return self.name is not None

    def feed(self, text: str) -> list[tuple[str, str]]:
        if self.held:
            return []
        if self.name is not None:
            fragment = self.args.feed(text)
            return [("args", fragment)] if fragment else []
        self._head += text
        head = match_head(self._head)
        if head == FAIL or (head == NEED and len(self._head) > MAX_HEAD_CHARS):
            self.held = True
            return []
        if isinstance(head, str):
            return []
        at, name = head
        if not self._streams(name):
            self.held = True
            return []
        self.name = name
        out = [("name", name)]
        fragment = self.args.feed(self._head[at:])
        self._head = ""
        return out + ([("args", fragment)] if fragment else [])

    def final_arguments(self, parsed: str) -> str:
        """The call's final arguments: the streamed text when it is the whole object and
        reads as the same value as `parsed` (the block's arguments as parse_block wrote
        them), else `parsed`."""
        if not self.args.complete:
            return parsed
        try:
            same = dumps(loads_exact(self.args.text)) == dumps(loads_exact(parsed))
        except (ValueError, RecursionError):
            same = False
        return self.args.text if same else parsed
