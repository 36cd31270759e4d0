"""KV-cache admission: rows join the batch only while the KV bytes they would hold fit a budget.

Pure (no MLX; the arithmetic is shared/kv_math.py, the cost per row is measured at load,
kv/cost.py). The estimate follows how mlx-lm's BatchKVCache (and our quantized one) holds a
batch: every row at the length of the longest one (left padding), rounded up to the cache's
256-token growth step; sliding-window layers at most their window, recurrent states once per
row. So one 30k-token row makes every row beside it hold 30k positions, and admission checks
that padded total, not the sum of the rows' own lengths. A row's whole length is its prompt
plus the whole output it may produce (its max_tokens, already clamped to the context's room): what
`check_alone` refuses beyond, and what a row that cannot be preempted is counted at; other
rows are counted block by block as they grow (reserve.py).
The budget itself comes from the worker's memory plan (memplan.py) or the setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxd.shared.errors import PayloadTooLarge
from mlxd.shared.kv_math import KV_STEP, RESERVED_OUTPUT_TOKENS, KvCost, padded, row_tokens
from mlxd.shared.sizes import format_size

MiB = 1024 * 1024

# Re-exported: the engine and its tests name them here.
__all__ = [
    "KV_STEP",
    "RESERVED_OUTPUT_TOKENS",
    "KvBudget",
    "KvCost",
    "padded",
    "row_tokens",
]


@dataclass(frozen=True)
class KvBudget:
    """`budget_bytes` of KV for at most `max_rows` rows, each holding what `cost` says."""

    cost: KvCost
    budget_bytes: int
    max_rows: int
    context_limit: int | None = None  # what a row without max_tokens may reach
    why: str = "kv_budget_bytes"  # where the budget comes from, for the 413

    @classmethod
    def of(
        cls,
        cost: KvCost | None,
        budget_bytes: int | None,
        max_rows: int,
        context_limit: int | None = None,
        why: str = "kv_budget_bytes",
    ):
        """A budget, or None (rows bounded by their count only) when either is unknown."""
        if cost is None or budget_bytes is None:
            return None
        return cls(cost, budget_bytes, max_rows, context_limit, why)

    def tokens(self, prompt_len: int, max_tokens: int | None) -> int:
        """Positions a row of this prompt and budget is counted at (row_tokens)."""
        return row_tokens(prompt_len, max_tokens, self.context_limit)

    def footprint(self, lengths: Sequence[int]) -> int:
        """Bytes a batch of rows of these lengths (in positions) holds, padded."""
        return self.cost.footprint(len(lengths), max(lengths, default=0))

    def admits(self, running: Sequence[int], new: int) -> bool:
        """Whether a row of `new` positions may join rows of `running` positions now."""
        if len(running) >= self.max_rows:
            return False
        return self.footprint([*running, new]) <= self.budget_bytes

    def output_room(self, prompt_len: int) -> int:
        """The most output tokens a row of this prompt may write and still fit alone."""
        return self.cost.max_context(self.budget_bytes) - prompt_len

    def check_alone(self, prompt_len: int, max_tokens: int | None) -> None:
        """Raise a 413 naming the numbers when this row would not fit even alone."""
        n = self.tokens(prompt_len, max_tokens)
        need = self.footprint([n])
        if need <= self.budget_bytes:
            return
        raise PayloadTooLarge(
            f"This request needs about {format_size(need)} of KV cache ({prompt_len} prompt "
            f"tokens + {n - prompt_len} reserved for output; {self.cost.describe()}); this "
            f"worker's KV budget is {format_size(self.budget_bytes)} "
            f"({self.why}). Send a shorter prompt or a smaller max_tokens",
            code="kv_budget_exceeded",
        )
