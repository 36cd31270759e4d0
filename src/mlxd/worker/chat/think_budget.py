"""A thinking budget at the sampler: after N reasoning tokens the row closes its reasoning block.

A per-row logits processor, attached like a grammar's (worker/grammar/processor.py). It follows
the row's tokens: inside a reasoning block (the prompt opened one, or the model wrote the
template's start marker) each token counts; once the budget is spent, the end marker's token
ids are forced one by one, and the model answers after them as if it had closed the block
itself. Until then the logits pass untouched, so greedy tokens equal mlx-lm's own generation.
The budget counts every reasoning token of the reply: a block opened after it is spent closes
at once.

The state lives in MLX scalars updated lazily from the fed tokens: reading a token on the CPU
each step would wait for the step in flight and stall the whole batch's pipeline.
"""

from __future__ import annotations

import mlx.core as mx

from mlxd.shared.params import GenerationParams


class ThinkBudget:
    """`fn(tokens, logits) -> logits` on the engine thread; `tokens` is the row's context (the
    prompt on the first call, then one more sampled token per call)."""

    # It follows the row's context by position (`_seen`): a preempted row resumed with the
    # same context counts nothing twice (engine/sched/preempt.py).
    resumable = True

    def __init__(
        self, budget: int, start: tuple[int, ...], end: tuple[int, ...], in_reasoning: bool
    ):
        self.budget = budget
        self._start = list(start)
        self._end = list(end)
        self._end_ids = mx.array(self._end, dtype=mx.int32)
        self._inside = mx.array(in_reasoning)
        self._spent = mx.array(0, dtype=mx.int32)  # reasoning tokens so far
        self._forced = mx.array(0, dtype=mx.int32)  # end-marker tokens forced so far
        self._prompt: int | None = None  # the context's length at the first call
        self._seen = 0
        self._ids: mx.array | None = None

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        flat = tokens.reshape(-1)
        n = flat.shape[0]
        if self._prompt is None:
            self._prompt = self._seen = n
        for p in range(self._seen, n):
            self._advance(flat, p)
        self._seen = max(self._seen, n)
        if self._ids is None or self._ids.shape[0] != logits.shape[-1]:
            self._ids = mx.arange(logits.shape[-1])
        target = self._end_ids[mx.minimum(self._forced, len(self._end) - 1)]
        only = mx.where(
            self._ids == target, mx.array(0, logits.dtype), mx.array(-mx.inf, logits.dtype)
        )
        return mx.where(self._forcing(), only, logits)

    def _forcing(self) -> mx.array:
        return self._inside & (self._spent >= self.budget)

    def _advance(self, flat: mx.array, p: int) -> None:
        """Take in the generated token at position `p`."""
        forcing = self._forcing()
        closed = self._ends_with(flat, p, self._end)
        opened = self._ends_with(flat, p, self._start)
        self._spent = self._spent + (self._inside & ~closed).astype(mx.int32)
        self._forced = mx.where(forcing & ~closed, self._forced + 1, 0)
        self._inside = mx.where(self._inside, ~closed, opened)

    def _ends_with(self, flat: mx.array, p: int, marker: list[int]) -> mx.array:
        """Whether the generated tokens up to `p` end with `marker` (the prompt's don't count:
        its own markers are in `in_reasoning`)."""
        assert self._prompt is not None  # __call__ sets it before any _advance
        if not marker or p + 1 - self._prompt < len(marker):
            return mx.array(False)
        tail = flat[p + 1 - len(marker) : p + 1]
        return mx.all(tail == mx.array(marker, dtype=flat.dtype))


def think_budget(
    tokenizer, params: GenerationParams, in_reasoning: bool, thinking_off: bool
) -> ThinkBudget | None:
    """The row's budget processor, or None: no budget asked for, a model without a reasoning
    block (the budget is ignored), or a prompt that turned thinking off."""
    budget = params.thinking_budget()
    if budget is None or not getattr(tokenizer, "has_thinking", False):
        return None
    if params.max_tokens is not None and budget >= params.max_tokens:
        # It cannot bind: no processor, so the row keeps speculation and a resume after a
        # failed step (and a budget past 2**31 never meets the int32 counter).
        return None
    if thinking_off and not in_reasoning:
        return None
    start = tuple(tokenizer.think_start_tokens or ())
    end = tuple(tokenizer.think_end_tokens or ())
    return ThinkBudget(budget, start, end, in_reasoning) if end else None
