"""KV-cache arithmetic from a model's config.json: bytes per token, padded rows, what fits.

Pure (no MLX), so the worker's admission (worker/engine/kvbudget.py) and the supervisor's fit
report (shared/fit.py) count alike. A token adds, in every layer, one key and one value vector
per KV head. At the model's float dtype that is head_dim x dtype bytes each; quantized to
`kv_bits` it is head_dim x bits / 8 bytes of packed values plus a scale and a bias (the float
dtype) per `kv_group_size` elements, as mx.quantize stores them. Batches hold every row at the
longest row's length, grown in steps of KV_STEP positions (mlx-lm's BatchKVCache, and ours).
"""

from __future__ import annotations

from dataclasses import dataclass

# Batch caches grow in steps of this many positions (mlx_lm.models.cache.BatchKVCache.step).
KV_STEP = 256
# Output tokens counted for a row that names no max_tokens and no context (engine tests only:
# every request's max_tokens is set, to the context's room at most, before it gets here).
RESERVED_OUTPUT_TOKENS = 1024
KV_BITS = (4, 8)  # the quantized schemes a model may set (16: the float dtype)


@dataclass(frozen=True)
class KvShape:
    """What one token's KV is made of: layers x KV heads x head dim."""

    layers: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of_config(cls, config: dict) -> KvShape | None:
        """From a config.json (multimodal wrappers nest it in text_config); None when it
        does not say."""
        cfg = config.get("text_config") or config
        try:
            layers = int(cfg["num_hidden_layers"])
            heads = int(cfg["num_attention_heads"])
            kv_heads = int(cfg.get("num_key_value_heads") or heads)
            head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return None
        return cls(layers, kv_heads, head_dim)

    def bytes_per_token(self, dtype_bytes: int, kv_bits: int | None = None, group: int = 64) -> int:
        """K and V bytes one token adds over all layers, at the float dtype or quantized."""
        if kv_bits is None:
            per_vector = self.head_dim * dtype_bytes
        else:
            per_vector = self.head_dim * kv_bits // 8 + 2 * (self.head_dim // group) * dtype_bytes
        return self.layers * self.kv_heads * 2 * per_vector


def kv_bytes_per_token(
    config: dict, dtype_bytes: int, kv_bits: int | None = None, group_size: int = 64
) -> int | None:
    """K and V bytes one token adds over all layers, from a model's config.json: layers x
    KV heads x head dim x 2 x dtype bytes (or the quantized size). None when the config does
    not say (no budget then)."""
    shape = KvShape.of_config(config)
    return None if shape is None else shape.bytes_per_token(dtype_bytes, kv_bits, group_size)


def row_tokens(prompt_len: int, max_tokens: int | None, context_limit: int | None = None) -> int:
    """Positions a row is counted at: its prompt plus all the output it may write (without a
    max_tokens: up to the context's end)."""
    if max_tokens is None:
        max_tokens = context_limit - prompt_len if context_limit else RESERVED_OUTPUT_TOKENS
    return prompt_len + max(1, max_tokens)


def padded(tokens: int) -> int:
    """Positions a batch cache holds for a row of `tokens` (its growth step)."""
    return -(-tokens // KV_STEP) * KV_STEP


def footprint(rows: int, positions: int, bytes_per_token: int) -> int:
    """Bytes `rows` rows of `positions` (the longest row's) hold in one batch."""
    return rows * padded(positions) * bytes_per_token if rows else 0


def max_context(budget_bytes: int, bytes_per_token: int) -> int:
    """The longest single row (prompt plus output) a KV budget holds, in whole steps."""
    if bytes_per_token <= 0:
        return 0
    return budget_bytes // bytes_per_token // KV_STEP * KV_STEP


def max_rows(budget_bytes: int, bytes_per_token: int, positions: int) -> int:
    """How many rows of `positions` each a KV budget holds at once."""
    one = footprint(1, max(1, positions), bytes_per_token)
    return budget_bytes // one if one > 0 else 0
