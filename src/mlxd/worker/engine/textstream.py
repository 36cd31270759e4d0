"""Turn a row's token ids into text deltas: UTF-8-safe detokenization plus stop strings.

Stop strings are matched on text (stops.StopScanner), so they are found across token
boundaries; text that might be the start of a stop string is held back until it is known not
to be, and a matched stop string is never emitted.
"""

from __future__ import annotations

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer

from mlxd.worker.engine.stops import StopScanner


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
        self._stops = StopScanner(stops)

    @property
    def stopped(self) -> bool:
        """Whether a stop string ended this row's text."""
        return self._stops.matched is not None

    def push(self, token: int) -> str:
        """Add one generated token; return the text that is now safe to emit."""
        if self.stopped:
            return ""
        self._detok.add_token(token)
        return self._stops.feed(self._detok.last_segment)

    def finish(self) -> str:
        """Flush everything held back (the row ended without a stop string)."""
        if self.stopped:
            return ""
        self._detok.finalize()
        return self._stops.feed(self._detok.last_segment) + self._stops.finish()
