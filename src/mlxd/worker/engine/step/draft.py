"""Drafters for speculative decoding: guesses of a row's next tokens, checked by the target.

- NgramDrafter (prompt lookup): the tokens that followed the last time the row's most recent
  n tokens appeared, in its prompt or its output. Free (no model, no memory), and strong where
  coding agents spend their time: rewriting a file repeats long stretches of the prompt.
- ModelDrafter: a small model of the same tokenizer, greedy over its own cache of the row.

A drafter only proposes; speculate.py verifies every proposal with one forward of the target,
so what a row emits never depends on the drafter.
"""

from __future__ import annotations

from typing import cast

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

# Longest and shortest suffix looked up; a 1-token match is a guess too weak to pay its verify.
from mlxd.worker.vision.ids import BASE as IMAGE_IDS

NGRAM_MAX = 3
NGRAM_MIN = 2
# A draft model catches up on a row's tokens (its prompt, the first time) one chunk this long
# per step, drafting nothing until it has: a long row that comes to decode alone does not
# hold the engine (and the requests arriving meanwhile) while its draft reads the context.
CATCH_UP_CHUNK = 2048


class NgramDrafter:
    """Prompt lookup over one row's tokens, indexed as they grow (O(1) per token)."""

    def __init__(self):
        self._seen: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after it
        self._n = 0  # tokens indexed (a row's tokens only grow)

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier occurrence of the suffix."""
        self._index(tokens)
        for n in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
            if len(tokens) <= n:
                continue
            at = self._seen.get(tuple(tokens[-n:]))
            if at is not None:
                return _copy(tokens, at, k)
        return []

    def _index(self, tokens: list[int]) -> None:
        # Every n-gram that has a follower: the suffix itself is indexed once one arrives.
        start, self._n = self._n, len(tokens)
        for end in range(max(start, NGRAM_MIN), len(tokens)):
            for n in range(NGRAM_MIN, NGRAM_MAX + 1):
                if end >= n:
                    self._seen[tuple(tokens[end - n : end])] = end

    def accepted(self, n_cached: int) -> None:
        """Nothing to keep in step: the index reads the row's tokens as they are."""

    def release(self) -> None:
        """Nothing held."""


def _copy(tokens: list[int], at: int, k: int) -> list[int]:
    """`k` tokens from `at` on, reading into the copy itself past the end (a repeating
    stretch near the end continues its period, as an overlapping LZ77 copy does). It stops
    at an image's token (worker/vision/ids.py): the model never writes one."""
    out: list[int] = []
    while len(out) < k:
        i = at + len(out)
        t = tokens[i] if i < len(tokens) else out[i - len(tokens)]
        if t >= IMAGE_IDS:
            break
        out.append(t)
    return out


class ModelDrafter:
    """Greedy drafts from a small model over its own KV cache of one row."""

    def __init__(self, model):
        self.model = model
        self._cache = make_prompt_cache(model)
        self._n = 0  # tokens of the row the draft cache holds

    def propose(self, tokens: list[int], k: int) -> list[int] | None:
        """Catch up on the row's tokens not yet in the draft cache, then draft `k` greedily
        (None: still catching up, a chunk a step; no draft yet, and no miss either).

        The draft model sees every token but the last through its cache; drafting feeds the
        last, then each draft: `k` forwards, one evaluation."""
        if k <= 0 or not tokens:
            return []
        behind = tokens[self._n : -1]
        if behind:
            chunk = behind[:CATCH_UP_CHUNK]
            # A text draft model reads an image's tokens as token 0: it has no features.
            seen = [t if t < IMAGE_IDS else 0 for t in chunk]
            self.model(mx.array([seen]), cache=self._cache)
            mx.eval([c.state for c in self._cache])
            self._n += len(chunk)
            if len(chunk) < len(behind):
                return None  # the rest over the next steps; the row decodes plainly meanwhile
        y = mx.array([[tokens[-1]]])
        drafts = []
        for _ in range(k):
            y = mx.argmax(self.model(y, cache=self._cache)[:, -1, :], axis=-1, keepdims=True)
            drafts.append(y)
        out = mx.concatenate(drafts, axis=1)
        mx.eval(out)
        self._n += k  # the last token and k - 1 drafts went in; the k-th draft did not
        return cast(list[int], out[0].tolist())  # mlx's stub: tolist() is list or scalar

    def accepted(self, n_cached: int) -> None:
        """The row's cache now holds `n_cached` tokens: drop the draft cache's rejected ones."""
        if self._n > n_cached:
            trim_prompt_cache(self._cache, self._n - n_cached)
            self._n = n_cached

    def release(self) -> None:
        self._cache = make_prompt_cache(self.model)
        self._n = 0
