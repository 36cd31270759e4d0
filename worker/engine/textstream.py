"""Turn a row's token ids into text deltas: UTF-8-safe detokenization plus stop strings.

Stop strings are matched on text, so they are found across token boundaries; text that might
be the start of a stop string is held back until it is known not to be, and a matched stop
string is never emitted.
"""

from __future__ import annotations

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer


class _ExactBPEDetokenizer(BPEStreamingDetokenizer):
    """mlx-lm's byte-level detokenizer without its trim of the first leading space.

    A completion that continues "Once upon a" must start with " time": the streamed text has
    to equal tokenizer.decode(tokens).
    """

    def _maybe_trim_space(self, current_text):
        return current_text


def make_detokenizer(tokenizer):
    """A fresh streaming detokenizer for one row."""
    detok = tokenizer.detokenizer
    if type(detok) is BPEStreamingDetokenizer:
        detok.__class__ = _ExactBPEDetokenizer
    return detok


class TextStream:
    """Detokenizes one row and cuts its text at the first stop string."""

    def __init__(self, detokenizer, stops: tuple[str, ...] = ()):
        self._detok = detokenizer
        self._stops = stops
        self._held = ""
        self.stopped = False

    def push(self, token: int) -> str:
        """Add one generated token; return the text that is now safe to emit."""
        if self.stopped:
            return ""
        self._detok.add_token(token)
        return self._scan(self._detok.last_segment)

    def finish(self) -> str:
        """Flush everything held back (the row ended without a stop string)."""
        if self.stopped:
            return ""
        self._detok.finalize()
        out = self._scan(self._detok.last_segment)
        out, self._held = out + self._held, ""
        return out

    def _scan(self, segment: str) -> str:
        if not self._stops:
            return segment
        buf = self._held + segment
        hits = [(buf.find(s), s) for s in self._stops]
        hits = [h for h in hits if h[0] >= 0]
        if hits:
            self.stopped = True
            self._held = ""
            return buf[: min(hits)[0]]
        keep = _longest_stop_prefix_suffix(buf, self._stops)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]


def _longest_stop_prefix_suffix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that begins some stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
