"""Tiny random-weight models of each model family mlxd serves, from mlx-lm's own model classes.

`build_family_model(dest, family)` writes a folder `mlx_lm.load` opens offline: the tiny
tokenizer and chat template of tiny_model.py, a config of that family at toy sizes, and weights
drawn by MLX (fixed seed) for the family's own `Model` class, so every layer kind a real
checkpoint of the family has (sliding windows, recurrent states, latent attention, experts)
runs for real. Windows are short (32 tokens) so prompts of a test's length wrap them.
Plain module (no pytest) so benchmarks and scripts can use it too.
"""

from __future__ import annotations

import importlib
import json
import pathlib

import mlx.core as mx
from mlx.utils import tree_flatten

from tiny_model import build_tiny_model

WINDOW = 32  # sliding-window layers' span, in tokens
_H = 128  # hidden size
_GAIN = 4.0

# The gated-delta hybrids' toy sizes (Qwen3-Next, Qwen3.5): every second layer attends.
_GATED_DELTA = {
    "hidden_size": _H,
    "num_hidden_layers": 4,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
    "full_attention_interval": 2,
    "max_position_embeddings": 4096,
}
# Their MoE checkpoints' routed and shared experts.
_EXPERTS = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 1,
    "shared_expert_intermediate_size": 64,
    "moe_intermediate_size": 64,
}
# Qwen3.5's text config (nested under the multimodal one as shipped).
_QWEN35_TEXT = {
    **_GATED_DELTA,
    "tie_word_embeddings": False,
    "rope_parameters": {
        "rope_type": "default",
        "mrope_section": [2, 1, 1],
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
    },
}

# Each family: its mlx-lm module and the config's own fields at toy sizes (the vocab, the
# special ids and the dtype come from the tokenizer's build).
FAMILIES: dict[str, dict] = {
    "dense": {
        "model_type": "qwen3",
        "hidden_size": _H,
        "num_hidden_layers": 2,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    },
    "gemma3": {
        "model_type": "gemma3_text",
        "hidden_size": _H,
        "num_hidden_layers": 4,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "sliding_window": WINDOW,
        "sliding_window_pattern": 2,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
    },
    # Gemma 4: sliding-window and global layers of different head sizes, the last layers
    # reading earlier layers' KV (num_kv_shared_layers), per-layer input embeddings.
    "gemma4": {
        "model_type": "gemma4_text",
        "hidden_size": _H,
        "num_hidden_layers": 4,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "global_head_dim": 64,
        "num_kv_shared_layers": 2,
        "hidden_size_per_layer_input": 16,
        "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "use_double_wide_mlp": False,
    },
    "gpt_oss": {
        "model_type": "gpt_oss",
        "hidden_size": _H,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": WINDOW,
        "rope_theta": 150000,
        "rms_norm_eps": 1e-5,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "qwen3_next": {
        "model_type": "qwen3_next",
        **_GATED_DELTA,
        **_EXPERTS,
        "mlp_only_layers": [],
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
    },
    # Qwen3.5 / 3.6: Qwen3-Next's layer kinds (gated delta + attention) in a dense model, its
    # text config nested under the multimodal one as the real checkpoints ship it.
    "qwen3_5": {
        "model_type": "qwen3_5",
        "text_config": {"model_type": "qwen3_5_text", **_QWEN35_TEXT},
        "tie_word_embeddings": False,
    },
    # Qwen3.5 / 3.6's MoE checkpoints (35B-A3B ...): the same layers with routed experts.
    "qwen3_5_moe": {
        "model_type": "qwen3_5_moe",
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            **_QWEN35_TEXT,
            **_EXPERTS,
        },
        "tie_word_embeddings": False,
    },
    # LFM2 (Liquid): short gated convolutions (a rolling conv state) + attention KV.
    "lfm2": {
        "model_type": "lfm2",
        "hidden_size": _H,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_dim": _H,
        "block_ff_dim": 256,
        "block_multiple_of": 32,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False,
        "layer_types": ["conv", "full_attention", "conv", "full_attention"],
        "rope_theta": 10000.0,
    },
    "nemotron_h": {
        "model_type": "nemotron_h",
        "hidden_size": _H,
        "intermediate_size": 256,
        "max_position_embeddings": 4096,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "attention_bias": False,
        "mamba_num_heads": 4,
        "mamba_head_dim": 32,
        "mamba_proj_bias": False,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "n_groups": 1,
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-5,
        "use_bias": False,
        "use_conv_bias": True,
        "hybrid_override_pattern": ["M", "*", "M", "-"],
        "num_hidden_layers": 4,
    },
    "granitemoehybrid": {
        "model_type": "granitemoehybrid",
        "hidden_size": _H,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "max_position_embeddings": 4096,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "attention_bias": False,
        "embedding_multiplier": 1.0,
        "attention_multiplier": 0.125,
        "logits_scaling": 1.0,
        "residual_multiplier": 1.0,
        "layer_types": ["mamba", "attention", "mamba", "attention"],
        "rms_norm_eps": 1e-6,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "shared_intermediate_size": 128,
        "mamba_n_heads": 8,
        "mamba_d_head": 32,
        "mamba_proj_bias": False,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_n_groups": 1,
        "mamba_conv_bias": True,
    },
    "deepseek_v3": {
        "model_type": "deepseek_v3",
        "hidden_size": _H,
        "intermediate_size": 256,
        "moe_intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_shared_experts": 1,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "kv_lora_rank": 64,
        "q_lora_rank": 96,
        "qk_rope_head_dim": 32,
        "v_head_dim": 32,
        "qk_nope_head_dim": 32,
        "first_k_dense_replace": 1,
        "max_position_embeddings": 4096,
    },
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "hidden_size": _H,
        "num_hidden_layers": 2,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": 64,
        "rms_norm_eps": 1e-6,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
        "norm_topk_prob": True,
    },
}


def build_family_model(dest: pathlib.Path, family: str, seed: int = 0) -> pathlib.Path:
    """Write a tiny model folder of `family` (a key of FAMILIES) at `dest`; return `dest`."""
    dest = pathlib.Path(dest)
    build_tiny_model(dest, arch="llama", seed=seed)
    base = json.loads((dest / "config.json").read_text())
    ids = {k: base[k] for k in ("vocab_size", "bos_token_id", "eos_token_id")}
    config = {**FAMILIES[family], **ids, "torch_dtype": "float32"}
    if family == "gemma4":
        config["vocab_size_per_layer_input"] = ids["vocab_size"]  # per-layer inputs' table
    if "text_config" in config:  # a multimodal config: the text model reads its own
        config["text_config"] = {**config["text_config"], **ids}
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    # MLX's default init leaves the layers small next to the embeddings: the residual stream
    # is then the input token and greedy decoding repeats it. Larger layers give varied text.
    weights = {
        k: v * _GAIN if v.ndim >= 2 and "embed" not in k and "norm" not in k else v
        for k, v in tree_flatten(model.parameters())
    }
    mx.save_safetensors(str(dest / "model.safetensors"), weights, metadata={"format": "mlx"})
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return dest
