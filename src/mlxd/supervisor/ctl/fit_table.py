"""`mlxctl fit`'s human output: the plan's numbers, one row per KV scheme, the worker now."""

from __future__ import annotations

from mlxd.supervisor.ctl.tables import memory_text, size, table


def _bits(n: int | None) -> str:
    if n is None:
        return "?"
    return "float" if n == 16 else f"{n}-bit"


def fit_text(body: dict) -> str:
    """GET /admin/fit's body as lines a person reads."""
    b = body
    lines = [
        f"{b['model']}: {b['layers']} layers x {b['kv_heads']} KV heads x {b['head_dim']} head"
        f" dim, context {b['context_length']}, batch {b['batch']}, KV {_bits(b['kv_bits'])}"
        f" (group {b['kv_group_size']}, {b['kv_dtype_bytes']}-byte floats)",
        f"plan: budget {size(b['budget_bytes'])} (machine {size(b['machine_memory_bytes'])})"
        f" - weights {size(b['weights_bytes'])} - prompt cache {size(b['prompt_cache_bytes'])}"
        f" - headroom {size(b['headroom_bytes'])} = KV {size(b['kv_budget_bytes'])}",
        "",
        table(
            ["KV", "BYTES/TOKEN", "CONTEXT AT BATCH 1", "BATCH AT CONTEXT"],
            [
                (
                    _bits(s["kv_bits"]) + (" *" if s["kv_bits"] == b["kv_bits"] else ""),
                    s["bytes_per_token"],
                    s["max_context_at_batch_1"],
                    s["max_batch_at_context"],
                )
                for s in b["schemes"]
            ],
        ),
    ]
    loaded = b.get("loaded")
    if loaded:
        lines += [
            "",
            f"now: {loaded['state']}, holds {memory_text(loaded['memory'])}",
            f"KV {_bits(loaded.get('kv_bits'))}: budget"
            f" {size(loaded.get('kv_budget_bytes')) or '-'}; budget free for it"
            f" {size(b['free_bytes'])}",
        ]
    else:
        lines += ["", f"now: not loaded; budget free for it {size(b['free_bytes'])}"]
    return "\n".join(lines)
