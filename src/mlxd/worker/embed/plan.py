"""How one embedding request becomes forwards (pure: no MLX).

Inputs are sorted by length and packed into batches whose padded size (rows x longest row)
stays within a token budget, so each forward costs about what one prefill chunk of the chat
engine costs. An input longer than the budget runs alone, in chunks of the budget over a
KV cache. The engine thread runs one forward per inbox job, so chat rows wait at most one
forward for an embedding request, however large it is.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Forward:
    """One forward: the inputs (by index into the request) it embeds, or one long input's
    chunk `start:stop` (`chunked`: there are other chunks of the same input)."""

    indices: tuple[int, ...]
    start: int = 0
    stop: int | None = None  # None: each row's whole length
    chunked: bool = False

    @property
    def last_chunk(self) -> bool:
        return self.stop is None


def plan_forwards(lengths: list[int], token_budget: int, max_rows: int) -> list[Forward]:
    """The forwards that embed inputs of these token `lengths`, shortest first.

    A batch holds at most `max_rows` rows and `token_budget` padded tokens; an input longer
    than `token_budget` is split into chunks of `token_budget` tokens (the last chunk's
    `stop` is None)."""
    budget = max(1, token_budget)
    forwards: list[Forward] = []
    batch: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: (lengths[j], j)):
        n = lengths[i]
        if n > budget:
            if batch:
                forwards.append(Forward(tuple(batch)))
                batch = []
            starts = list(range(0, n, budget))
            for s in starts:
                stop = s + budget if s + budget < n else None
                forwards.append(Forward((i,), s, stop, chunked=True))
            continue
        # Sorted ascending: the row joining is the longest, so it sets the padded size.
        if batch and ((len(batch) + 1) * n > budget or len(batch) >= max_rows):
            forwards.append(Forward(tuple(batch)))
            batch = []
        batch.append(i)
    if batch:
        forwards.append(Forward(tuple(batch)))
    return forwards
