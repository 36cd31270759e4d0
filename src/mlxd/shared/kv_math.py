"""KV-cache arithmetic: what a row's caches hold, padded rows, what fits.

Pure (no MLX), so the worker's admission (worker/kv/budget.py) and the supervisor's fit report
(shared/fit.py) count alike. A row's caches hold, in bytes (`KvCost`):

    per_token x n  +  windowed_per_token x min(n, window)  +  per_row

for a row of n positions: full-attention layers grow with every token, sliding-window layers
(mlx-lm's RotatingKVCache) stop at their window, recurrent layers (ArraysCache: Mamba and
gated-delta states, conv tails) hold a fixed state per row. The worker measures the three
from the model's own caches at load (worker/kv/cost.py); the supervisor, which never loads a
model, reads them from config.json (shared/kv_config.py). Batches hold every row at the
longest row's length, grown in steps of KV_STEP positions (mlx-lm's BatchKVCache, and ours);
a window's buffer grows by the same step but never past the window.
"""

from __future__ import annotations

from dataclasses import dataclass

# Batch caches grow in steps of this many positions (mlx_lm.models.cache.BatchKVCache.step).
KV_STEP = 256
# Output tokens counted for a row that names no max_tokens and no context (engine tests only:
# every request's max_tokens is set, to the context's room at most, before it gets here).
RESERVED_OUTPUT_TOKENS = 1024
KV_BITS = (4, 8)  # the quantized schemes a model may set (16: the float dtype)
# What max_context answers when no row length outgrows the budget (windows and states only).
UNBOUNDED = 1 << 62


@dataclass(frozen=True)
class KvCost:
    """Bytes a row's caches hold: `per_token` per position in full-attention layers,
    `windowed_per_token` per position in sliding-window layers up to `window` positions, and
    `per_row` of fixed (recurrent) state."""

    per_token: int
    windowed_per_token: int = 0
    window: int = 0
    per_row: int = 0

    def __add__(self, other: KvCost) -> KvCost:
        """Two groups of layers together (one window: the wider, so never undercounted)."""
        return KvCost(
            self.per_token + other.per_token,
            self.windowed_per_token + other.windowed_per_token,
            max(self.window, other.window),
            self.per_row + other.per_row,
        )

    def row_bytes(self, tokens: int) -> int:
        """Bytes one row of `tokens` positions holds, unpadded (a row cache's own)."""
        windowed = self.windowed_per_token * min(tokens, self.window)
        return self.per_token * tokens + windowed + self.per_row

    def padded_row_bytes(self, positions: int) -> int:
        """Bytes one row holds in a batch whose longest row has `positions` (growth steps)."""
        p = padded(positions)
        return self.per_token * p + self.windowed_per_token * min(p, self.window) + self.per_row

    def footprint(self, rows: int, positions: int) -> int:
        """Bytes `rows` rows of `positions` (the longest row's) hold in one batch."""
        return rows * self.padded_row_bytes(positions) if rows else 0

    def max_context(self, budget_bytes: int) -> int:
        """The longest single row (prompt plus output) a KV budget holds, in whole steps
        (UNBOUNDED when even the longest row holds no more than the budget)."""
        if self.padded_row_bytes(1) > budget_bytes:
            return 0
        if self.per_token <= 0:
            return UNBOUNDED
        lo, hi = 1, budget_bytes // self.per_token // KV_STEP + 1  # steps; hi never fits
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (
                (mid, hi) if self.padded_row_bytes(mid * KV_STEP) <= budget_bytes else (lo, mid)
            )
        return lo * KV_STEP

    def max_rows(self, budget_bytes: int, positions: int) -> int:
        """How many rows of `positions` each a KV budget holds at once."""
        one = self.footprint(1, max(1, positions))
        return budget_bytes // one if one > 0 else 0

    def report(self) -> dict:
        """The cost as /stats names it (kv_bytes_per_token: the full-attention part)."""
        return {
            "kv_bytes_per_token": self.per_token,
            "kv_windowed_bytes_per_token": self.windowed_per_token,
            "kv_window": self.window,
            "kv_state_bytes_per_row": self.per_row,
        }

    @classmethod
    def of_report(cls, report: dict) -> KvCost | None:
        """The cost a /stats body reports (None: it reports none)."""
        per_token = report.get("kv_bytes_per_token")
        if per_token is None:
            return None
        return cls(
            int(per_token),
            int(report.get("kv_windowed_bytes_per_token") or 0),
            int(report.get("kv_window") or 0),
            int(report.get("kv_state_bytes_per_row") or 0),
        )

    def describe(self) -> str:
        """The cost in words a 413 can carry."""
        parts = [f"{self.per_token} bytes per token"]
        if self.windowed_per_token:
            parts.append(f"{self.windowed_per_token} per token of a {self.window}-token window")
        if self.per_row:
            parts.append(f"{self.per_row} of state per row")
        return ", ".join(parts)


def row_tokens(prompt_len: int, max_tokens: int | None, context_limit: int | None = None) -> int:
    """Positions a row is counted at: its prompt plus all the output it may write (without a
    max_tokens: up to the context's end)."""
    if max_tokens is None:
        max_tokens = context_limit - prompt_len if context_limit else RESERVED_OUTPUT_TOKENS
    return prompt_len + max(1, max_tokens)


def padded(tokens: int) -> int:
    """Positions a batch cache holds for a row of `tokens` (its growth step)."""
    return -(-tokens // KV_STEP) * KV_STEP


def max_context(budget_bytes: int, bytes_per_token: int) -> int:
    """The longest single row a KV budget holds, every layer full attention."""
    return KvCost(bytes_per_token).max_context(budget_bytes) if bytes_per_token > 0 else 0


def max_rows(budget_bytes: int, bytes_per_token: int, positions: int) -> int:
    """How many rows of `positions` each a KV budget holds, every layer full attention."""
    return KvCost(bytes_per_token).max_rows(budget_bytes, positions)
