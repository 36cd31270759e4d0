"""Stop strings on streamed text: the one scanner the engine and the chat driver share.

Text arrives in pieces, so a stop string can span two of them: a tail that might begin a stop
string is held back until the next piece decides, the earliest match wins, and the matched
string itself is never emitted. It works on decoded text (never on bytes), so a cut can never
split a character.
"""

from __future__ import annotations


def held_tail_len(text: str, needles: tuple[str, ...] | list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `needles`."""
    best = 0
    for needle in needles:
        for n in range(min(len(needle) - 1, len(text)), best, -1):
            if text.endswith(needle[:n]):
                best = n
                break
    return best


class StopScanner:
    """Cuts a text stream at the first stop string, holding back a tail that may begin one.

    `matched` names the stop string that ended the stream (None while none has); ties at one
    position go to the string that sorts first.
    """

    def __init__(self, stops: tuple[str, ...] = ()):
        self.stops = stops
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Add a piece of text; return what is now certain not to be (part of) a stop string."""
        if self.matched is not None:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        hits = [(at, s) for s in self.stops if (at := buf.find(s)) >= 0]
        if hits:
            at, self.matched = min(hits)
            self._held = ""
            return buf[:at]
        keep = held_tail_len(buf, self.stops)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep]

    def finish(self) -> str:
        """The stream ended: release the held tail (nothing once a stop string matched)."""
        held, self._held = self._held, ""
        return "" if self.matched is not None else held
