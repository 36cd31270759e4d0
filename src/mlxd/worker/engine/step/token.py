"""What a decode step hands back per row (Token) and where its time went (Clock)."""

from __future__ import annotations

from collections import defaultdict

import mlx.core as mx


class Token:
    """One row's token from a step, shaped as mlx-lm's GenerationBatch.Response."""

    __slots__ = ("uid", "token", "finish_reason", "prompt_cache", "all_tokens", "_lp", "_i")

    def __init__(self, uid, token, finish_reason, prompt_cache, all_tokens, lp, i):
        self.uid, self.token, self.finish_reason = uid, token, finish_reason
        self.prompt_cache, self.all_tokens = prompt_cache, all_tokens
        self._lp, self._i = lp, i

    @property
    def logprobs(self) -> mx.array:
        """This row's log-probabilities over the vocabulary (read only when asked for)."""
        return self._lp[self._i]


class Clock(defaultdict):
    """Seconds per phase of the decode step, summed over steps."""

    def __init__(self):
        super().__init__(float)
        self.steps = 0
