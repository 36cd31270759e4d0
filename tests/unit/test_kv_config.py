"""What `mlxctl fit` plans before a model is loaded: a row's KV from config.json, per family
(full attention, MLA latents, sliding windows, hybrids' recurrent states), and what a budget
holds of rows that cost so. The shapes are the real checkpoints' (their config.json fields);
tests/integration/test_kv_cost.py checks the same arithmetic against mlx-lm's caches."""

from __future__ import annotations

from mlxd.shared.kv_config import KvLayout, kv_bytes_per_token, kv_cost_of_config
from mlxd.shared.kv_math import KV_STEP, UNBOUNDED, KvCost

GiB = 1024**3
BF16 = 2

DEEPSEEK_V3 = {  # DeepSeek-V3 / R1 (Kimi K2 has the same attention)
    "model_type": "deepseek_v3",
    "num_hidden_layers": 61,
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
}
DEEPSEEK_V2_LITE = {
    "model_type": "deepseek_v2",
    "num_hidden_layers": 27,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
}
GEMMA3_27B = {
    "model_type": "gemma3",
    "text_config": {
        "model_type": "gemma3_text",
        "num_hidden_layers": 62,
        "hidden_size": 5376,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
    },
}
GPT_OSS_20B = {
    "model_type": "gpt_oss",
    "num_hidden_layers": 24,
    "hidden_size": 2880,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
}
QWEN3_NEXT_80B = {
    "model_type": "qwen3_next",
    "num_hidden_layers": 48,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "full_attention_interval": 4,
    "linear_num_value_heads": 32,
    "linear_num_key_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
}
NEMOTRON_H_8B = {
    "model_type": "nemotron_h",
    "num_hidden_layers": 52,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "conv_kernel": 4,
    "n_groups": 8,
}
GRANITE_4_H = {
    "model_type": "granitemoehybrid",
    "num_hidden_layers": 8,
    "hidden_size": 1536,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "layer_types": ["mamba"] * 3 + ["attention"] + ["mamba"] * 3 + ["attention"],
    "mamba_n_heads": 48,
    "mamba_d_head": 64,
    "mamba_d_state": 128,
    "mamba_d_conv": 4,
    "mamba_n_groups": 1,
}
QWEN3_8B = {  # a window in the config mlx-lm does not keep
    "model_type": "qwen3",
    "num_hidden_layers": 36,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "sliding_window": 32768,
    "use_sliding_window": False,
}


def cost(config: dict) -> KvCost:
    c = kv_cost_of_config(config, BF16)
    assert c is not None
    return c


def test_a_dense_model_holds_layers_x_kv_heads_x_head_dim_per_token():
    assert cost(QWEN3_8B) == KvCost(36 * 8 * 128 * 2 * BF16)
    mistral = {**QWEN3_8B, "model_type": "mistral", "sliding_window": 4096}
    del mistral["use_sliding_window"]
    assert cost(mistral) == cost(QWEN3_8B)  # mlx-lm keeps a full cache for it


def test_an_mla_model_holds_its_latent_and_rope_key_not_per_head_k_and_v():
    # 512 + 64 values per layer and token: 25x less than 128 heads of K and V would be.
    assert cost(DEEPSEEK_V3) == KvCost(61 * (512 + 64) * BF16)
    layout = KvLayout.of_config(DEEPSEEK_V3)
    assert layout is not None and layout.dims() == {512, 64}
    assert not layout.quantizable  # its attention reads no quantized KV: no 8/4-bit rows


def test_deepseek_v2_caches_k_and_v_of_different_head_dims():
    # K: 128 nope + 64 rope, V: 128, per head; the head-dim arithmetic said 128 for both.
    assert cost(DEEPSEEK_V2_LITE) == KvCost(27 * 16 * (192 + 128) * BF16)
    assert kv_bytes_per_token(DEEPSEEK_V2_LITE, BF16) == 276_480


def test_sliding_window_layers_hold_their_window_and_the_others_the_context():
    # Gemma 3: every 6th of 62 layers attends to all (10), the other 52 to 1024 tokens.
    g = cost(GEMMA3_27B)
    assert g == KvCost(10 * 16 * 128 * 2 * BF16, 52 * 16 * 128 * 2 * BF16, 1024)
    assert g.row_bytes(32768) == 10 * 16 * 512 * 32768 + 52 * 16 * 512 * 1024
    # gpt-oss: every other layer, a 128-token window.
    assert cost(GPT_OSS_20B) == KvCost(12 * 8 * 64 * 2 * BF16, 12 * 8 * 64 * 2 * BF16, 128)
    layout = KvLayout.of_config(GEMMA3_27B)
    assert layout is not None and not layout.quantizable  # mlx-lm quantizes no window


def test_hybrids_grow_only_in_their_attention_layers_and_hold_a_state_per_row():
    # Qwen3-Next: 12 of 48 layers attend; 36 gated-delta layers hold a float32 state of
    # 32 heads x 128 x 128 and a bf16 conv tail of 3 x (2 x 16 x 128 + 32 x 128) each.
    state = 32 * 128 * 128 * 4 + 3 * (2 * 16 * 128 + 32 * 128) * BF16
    assert cost(QWEN3_NEXT_80B) == KvCost(12 * 2 * 256 * 2 * BF16, per_row=36 * state)
    # Nemotron-H: 4 attention layers ("*"), 24 Mamba 2 layers ("M"), MLPs ("-") hold nothing.
    mamba = 128 * 64 * 128 * 4 + 3 * (128 * 64 + 2 * 8 * 128) * BF16
    assert cost(NEMOTRON_H_8B) == KvCost(4 * 8 * 128 * 2 * BF16, per_row=24 * mamba)
    # Granite 4 hybrid: layer_types; heads of hidden / heads = 128.
    mamba = 48 * 64 * 128 * 4 + 3 * (48 * 64 + 2 * 128) * BF16
    assert cost(GRANITE_4_H) == KvCost(2 * 4 * 128 * 2 * BF16, per_row=6 * mamba)
    layout = KvLayout.of_config(GRANITE_4_H)
    assert layout is not None and layout.counts() == (2, 0, 6)
    assert layout.quantizable  # its attention layers quantize; the states stay float


def test_quantized_kv_packs_each_of_k_and_v_at_its_own_dim():
    # 8-bit: dim bytes plus a bf16 scale and bias per 64 values.
    assert kv_cost_of_config(DEEPSEEK_V3, BF16, 8) == KvCost(
        61 * (512 + 2 * 8 * BF16 + 64 + 2 * BF16)
    )
    assert kv_bytes_per_token({"hidden_size": 8}, BF16) is None  # says nothing: no plan


def test_windows_and_states_change_what_a_budget_holds():
    g = cost(GEMMA3_27B)
    # Rows pad to 256 positions; a window's buffer never past its window.
    assert g.footprint(2, 300) == 2 * (g.per_token * 512 + g.windowed_per_token * 512)
    assert g.footprint(1, 5000) == g.per_token * 5120 + g.windowed_per_token * 1024
    longest = g.max_context(8 * GiB)
    assert longest % KV_STEP == 0
    assert g.footprint(1, longest) <= 8 * GiB < g.footprint(1, longest + KV_STEP)
    # A state per row bounds the rows, not the length.
    n = cost(NEMOTRON_H_8B)
    assert n.max_rows(GiB, 1) == GiB // (n.per_token * KV_STEP + n.per_row)
    assert KvCost(0, 100, 128, 10).max_context(GiB) == UNBOUNDED  # windows and states only
    assert KvCost(0, 0, 0, GiB + 1).max_context(GiB) == 0  # not even one row's state fits


GEMMA4_SPELLED = {  # every field mlx-lm's gemma4_text would otherwise default, spelled out
    "model_type": "gemma4_text",
    "hidden_size": 1536,
    "num_hidden_layers": 35,
    "num_attention_heads": 8,
    "head_dim": 256,
    "global_head_dim": 512,
    "num_key_value_heads": 1,
    "sliding_window": 512,
    "sliding_window_pattern": 5,
    "num_kv_shared_layers": 20,
}


def test_a_gemma4_config_leaving_fields_out_is_planned_with_mlx_lms_defaults():
    spelled = kv_cost_of_config(GEMMA4_SPELLED, BF16)
    sparse = {k: GEMMA4_SPELLED[k] for k in ("model_type", "hidden_size", "num_hidden_layers")}
    sparse["num_attention_heads"] = 8
    assert kv_cost_of_config(sparse, BF16) == spelled
    # Nested in a multimodal config whose text part names no model type.
    wrapped = {"model_type": "gemma4", "text_config": {**sparse, "model_type": None}}
    assert kv_cost_of_config(wrapped, BF16) == spelled
    # 15 layers hold KV (20 read others'): 12 windows of 512 (1 KV head × 256) and 3 global
    # layers (1 × 512), K and V in bf16.
    assert spelled is not None and spelled.window == 512
    assert spelled.per_token == 3 * 2 * 512 * BF16
    assert spelled.windowed_per_token == 12 * 2 * 256 * BF16


def test_lfm2_without_layer_types_reads_its_attention_indices():
    base = {
        "model_type": "lfm2",
        "hidden_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "conv_L_cache": 3,
    }
    full = [2, 5, 8, 10, 12, 14]
    types = ["full_attention" if i in full else "conv" for i in range(16)]
    by_types = kv_cost_of_config({**base, "layer_types": types}, BF16)
    assert kv_cost_of_config({**base, "full_attn_idxs": full}, BF16) == by_types
    assert by_types is not None and by_types.per_token == 6 * 2 * 8 * 64 * BF16
    assert by_types.per_row == 10 * 2 * 2048 * BF16  # each conv layer's last 2 inputs
