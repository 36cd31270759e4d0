"""KV-cache admission: rows join the batch only while the KV bytes they would hold fit a budget.

Pure (no MLX). The estimate follows how mlx-lm's BatchKVCache holds a batch: every row at the
length of the longest one (left padding), rounded up to the cache's 256-token growth step. So
one 30k-token row makes every row beside it hold 30k positions, and admission checks that
padded total, not the sum of the rows' own lengths. A row is counted at its prompt plus the
whole output it may produce (its max_tokens, already clamped to the context's room): a row
then never grows past what admission counted, and a row that stops early frees its room.
The budget itself comes from the worker's memory plan (memplan.py) or the setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxd.shared.errors import PayloadTooLarge

# Output tokens counted for a row that names no max_tokens and no context (engine tests only:
# every request's max_tokens is set, to the context's room at most, before it gets here).
RESERVED_OUTPUT_TOKENS = 1024
# BatchKVCache grows in steps of this many positions (mlx_lm.models.cache.BatchKVCache.step).
KV_STEP = 256
MiB = 1024 * 1024


def kv_bytes_per_token(config: dict, dtype_bytes: int) -> int | None:
    """K and V bytes one token adds over all layers, from a model's config.json: layers x
    KV heads x head dim x 2 x dtype bytes. None when the config does not say (no budget then)."""
    cfg = config.get("text_config") or config  # multimodal wrappers nest the language model
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return layers * kv_heads * head_dim * 2 * dtype_bytes


def row_tokens(prompt_len: int, max_tokens: int | None, context_limit: int | None = None) -> int:
    """Positions a row is counted at: its prompt plus all the output it may write (without a
    max_tokens: up to the context's end)."""
    if max_tokens is None:
        max_tokens = context_limit - prompt_len if context_limit else RESERVED_OUTPUT_TOKENS
    return prompt_len + max(1, max_tokens)


def padded(tokens: int) -> int:
    return -(-tokens // KV_STEP) * KV_STEP


@dataclass(frozen=True)
class KvBudget:
    """`budget_bytes` of KV for at most `max_rows` rows of `bytes_per_token` each."""

    bytes_per_token: int
    budget_bytes: int
    max_rows: int
    context_limit: int | None = None  # what a row without max_tokens may reach
    why: str = "kv_budget_bytes"  # where the budget comes from, for the 413

    @classmethod
    def of(
        cls,
        bytes_per_token: int | None,
        budget_bytes: int | None,
        max_rows: int,
        context_limit: int | None = None,
        why: str = "kv_budget_bytes",
    ):
        """A budget, or None (rows bounded by their count only) when either is unknown."""
        if not bytes_per_token or budget_bytes is None:
            return None
        return cls(bytes_per_token, budget_bytes, max_rows, context_limit, why)

    def tokens(self, prompt_len: int, max_tokens: int | None) -> int:
        """Positions a row of this prompt and budget is counted at (row_tokens)."""
        return row_tokens(prompt_len, max_tokens, self.context_limit)

    def footprint(self, lengths: Sequence[int]) -> int:
        """Bytes a batch of rows of these lengths (in positions) holds, padded."""
        if not lengths:
            return 0
        return len(lengths) * padded(max(lengths)) * self.bytes_per_token

    def admits(self, running: Sequence[int], new: int) -> bool:
        """Whether a row of `new` positions may join rows of `running` positions now."""
        if len(running) >= self.max_rows:
            return False
        return self.footprint([*running, new]) <= self.budget_bytes

    def check_alone(self, prompt_len: int, max_tokens: int | None) -> None:
        """Raise a 413 naming the numbers when this row would not fit even alone."""
        n = self.tokens(prompt_len, max_tokens)
        need = self.footprint([n])
        if need <= self.budget_bytes:
            return
        raise PayloadTooLarge(
            f"This request needs about {need / MiB:.1f} MiB of KV cache ({prompt_len} prompt "
            f"tokens + {n - prompt_len} reserved for output, {self.bytes_per_token} bytes per "
            f"token); this worker's KV budget is {self.budget_bytes / MiB:.1f} MiB "
            f"({self.why}). Send a shorter prompt or a smaller max_tokens",
            code="kv_budget_exceeded",
        )
