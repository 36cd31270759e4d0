"""The fit report's arithmetic: for a model on this machine, what each KV scheme makes room for.

Pure (no MLX): the supervisor runs it from the model folder's config.json and its settings
(supervisor/admin/fit.py). The plan is the worker's own (shared/memory_plan.py) for the model
alone under the memory budget; each scheme (the float dtype, 8-bit, 4-bit) then gives its
bytes per token (shared/kv_math.py), the longest row that fits at batch 1 and the most rows
that fit at the model's whole context (the `batch` setting may allow fewer).
"""

from __future__ import annotations

from mlxd.shared.kv_math import KV_BITS, KvShape, max_context, max_rows
from mlxd.shared.memory_plan import MemoryPlan
from mlxd.shared.wire.admin import FitScheme

FLOAT_BITS = 16  # how the report names the model's own float KV (whatever its width)
# config.json's dtype names and their bytes; anything else counts as 2 (the usual bf16/fp16).
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def dtype_bytes_of(config: dict) -> int:
    """Bytes of the float dtype a model's config.json names (its KV and KV scales)."""
    cfg = config.get("text_config") or config
    name = cfg.get("torch_dtype") or cfg.get("dtype") or config.get("torch_dtype")
    return DTYPE_BYTES.get(str(name), 2)


def fit_schemes(
    shape: KvShape,
    plan: MemoryPlan,
    *,
    dtype_bytes: int,
    context: int,
    group_size: int = 64,
) -> list[FitScheme]:
    """One row per KV scheme: its bytes per token and what the plan's KV budget holds."""
    rows = []
    for bits in (None, *sorted(KV_BITS, reverse=True)):
        if bits is not None and shape.head_dim % group_size:
            continue  # this group size cannot quantize these heads (the worker refuses it)
        bpt = shape.bytes_per_token(dtype_bytes, bits, group_size)
        longest = max_context(plan.kv_budget_bytes, bpt)
        rows.append(
            FitScheme(
                kv_bits=FLOAT_BITS if bits is None else bits,
                bytes_per_token=bpt,
                max_context_at_batch_1=min(longest, context),
                max_batch_at_context=max_rows(plan.kv_budget_bytes, bpt, context),
                fits_context=longest >= context,
            )
        )
    return rows
