"""What mlxd does with each model family: the table docs/model-families.md shows, asserted by
the family tests (tests/integration/test_family_engine.py, tests/e2e/test_model_families.py)
and by tests/unit/test_family_table.py against the docs, so the page cannot drift from them.

Pure Python (no MLX): the unit test imports it.
"""

from __future__ import annotations

# family: (example models, layer kinds)
FAMILY_ROWS = {
    "dense": ("Qwen3, Llama 3, Mistral, SmolLM2", "attention KV"),
    "gemma3": ("Gemma 3", "sliding window + attention KV"),
    "gemma4": (
        "Gemma 4",
        "sliding window + attention KV, KV shared across layers, per-layer inputs",
    ),
    "gpt_oss": ("gpt-oss 20B/120B", "sliding window + attention KV, sinks, MoE"),
    "qwen3_next": ("Qwen3-Next", "gated delta (recurrent) + attention KV, MoE"),
    "qwen3_5": ("Qwen3.5, Qwen3.6", "gated delta (recurrent) + attention KV"),
    "qwen3_5_moe": ("Qwen3.5/3.6 35B-A3B", "gated delta (recurrent) + attention KV, MoE"),
    "lfm2": ("LFM2", "short convolutions (rolling state) + attention KV"),
    "nemotron_h": ("Nemotron-H", "Mamba2 (recurrent) + attention KV"),
    "granitemoehybrid": ("Granite 4.0 hybrid", "Mamba2 (recurrent) + attention KV, MoE"),
    "deepseek_v3": ("DeepSeek V3, Kimi K2", "MLA latent KV, MoE"),
    "qwen3_moe": ("Qwen3-30B-A3B", "attention KV, MoE"),
}

# Families whose every layer is attention KV: they trim to any prefix, so rejected drafts can
# be cut back (speculation), their KV quantizes (kv_bits) and their decode step compiles.
ATTENTION_ONLY = {"dense", "deepseek_v3", "qwen3_moe"}
# Families whose attention KV quantizes (kv_bits): attention-only ones but MLA, whose attention
# reads the cache's arrays itself, and hybrids (their recurrent states stay as they are);
# sliding windows have no quantized form in mlx-lm.
KV_BITS = {
    "dense",
    "qwen3_moe",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "lfm2",
    "nemotron_h",
    "granitemoehybrid",
}
# Families with recurrent layers (a state per row that does not grow with tokens).
RECURRENT = {"qwen3_next", "qwen3_5", "qwen3_5_moe", "lfm2", "nemotron_h", "granitemoehybrid"}
# Families whose layers ignore a batched prefill's padding on the pinned mlx-lm.
PREFILL_ONE_AT_A_TIME = {"nemotron_h"}

COLUMNS = (
    "batching",
    "RAM cache",
    "SSD cache, drain, restore",
    "kv_bits",
    "speculative",
    "compiled decode",
)


def support(family: str) -> dict[str, str]:
    """Each column's cell for `family`."""
    attention = family in ATTENTION_ONLY
    return {
        "batching": "yes, prefill one row at a time" if family in PREFILL_ONE_AT_A_TIME else "yes",
        "RAM cache": "yes" if attention else "yes, at turn boundaries",
        "SSD cache, drain, restore": "yes" if attention else "yes, at turn boundaries",
        "kv_bits": kv_bits(family),
        "speculative": "yes"
        if attention
        else "off, with a warning (a rejected draft cannot be cut back)",
        "compiled decode": "yes, checked against the plain forward"
        if attention
        else "no (the plain forward)",
    }


def kv_bits(family: str) -> str:
    if family in KV_BITS:
        return "yes" if family in ATTENTION_ONLY else "yes, attention layers (states stay float)"
    if family in ATTENTION_ONLY:
        return "refused at load (its MLA attention reads no quantized KV)"
    return "refused at load (mlx-lm has no quantized sliding window)"


def table() -> str:
    """The markdown table of docs/model-families.md."""
    head = ["family (`model_type`)", "examples", "layers", *COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for family, (examples, layers) in FAMILY_ROWS.items():
        cells = [f"`{family}`", examples, layers, *support(family).values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")
