"""The fit report's arithmetic: for a model on this machine, what each KV scheme makes room for.

Pure (no MLX): the supervisor runs it from the model folder's config.json and its settings
(supervisor/admin/fit.py). The plan is the worker's own (shared/memory_plan.py) for the model
alone under the memory budget; each scheme (the float dtype, 8-bit, 4-bit) then gives what a
row holds (shared/kv_config.py: per token, per token of a sliding window, per row of recurrent
state), the longest row that fits at batch 1 and the most rows that fit at the model's whole
context (the `batch` setting may allow fewer). A running worker's scheme counts what the
worker measured from its own caches instead.
"""

from __future__ import annotations

from mlxd.shared.kv_config import KvLayout
from mlxd.shared.kv_math import KV_BITS, KvCost
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
    layout: KvLayout,
    plan: MemoryPlan,
    *,
    dtype_bytes: int,
    context: int,
    group_size: int = 64,
    measured: dict[int, KvCost] | None = None,
) -> list[FitScheme]:
    """One row per KV scheme: what a row holds and what the plan's KV budget holds.
    `measured`: a running worker's own cost, by its scheme's bits (16: float)."""
    rows = []
    quantizable = layout.quantizable and not any(d % group_size for d in layout.dims())
    for bits in (None, *sorted(KV_BITS, reverse=True)):
        if bits is not None and not quantizable:
            continue  # windows, states or heads the group cannot divide: the worker refuses
        name = FLOAT_BITS if bits is None else bits
        cost = (measured or {}).get(name)
        rows.append(
            _scheme(
                name,
                cost or layout.cost(dtype_bytes, bits, group_size),
                plan,
                context,
                measured=cost is not None,
            )
        )
    return rows


def _scheme(bits: int, cost: KvCost, plan: MemoryPlan, context: int, measured: bool) -> FitScheme:
    longest = cost.max_context(plan.kv_budget_bytes)
    return FitScheme(
        kv_bits=bits,
        bytes_per_token=cost.per_token,
        windowed_bytes_per_token=cost.windowed_per_token,
        window=cost.window,
        state_bytes_per_row=cost.per_row,
        bytes_at_context=cost.row_bytes(context),
        measured=measured,
        max_context_at_batch_1=min(longest, context),
        max_batch_at_context=cost.max_rows(plan.kv_budget_bytes, context),
        fits_context=longest >= context,
    )
