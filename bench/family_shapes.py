"""Random-weight models of the sliding-window and hybrid families (issue 34): the config of a
real checkpoint of the family and weights drawn by MLX for mlx-lm's own `Model` class of that
`model_type`, so every layer kind the real model has (sliding windows, recurrent states,
experts) runs at its real size. bench/models.py writes the folder (tokenizer, config, shards).

Which hybrid: `nemotron-h-8b` is the one the H200 step runs. Its Mamba2 layers prefill in
256-token chunks of matrix products on any device; `qwen3-next-class` is here too, but on CUDA
mlx-lm 0.32.2 runs its gated-delta recurrence one token at a time in Python
(`gated_delta_ops`: the fused kernel is Metal-only), so a 16k prefill is ~600k small kernel
calls through its 36 linear-attention layers, minutes where the budget has seconds.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SHAPES: dict[str, dict] = {
    # google/gemma-3-12b-it's text config: 5 sliding-window layers (1,024 tokens) to 1 global.
    # Its lm_head is the embedding matrix (tied), so the folder has none, as the real one.
    "gemma3-12b": {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": 3840,
        "num_hidden_layers": 48,
        "intermediate_size": 15360,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 131072,
        "vocab_size": 262208,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    # nvidia/Nemotron-H-8B-Reasoning-128K: 24 Mamba2, 24 MLP and 4 attention layers (no RoPE).
    "nemotron-h-8b": {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "hidden_size": 4096,
        "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
        "num_hidden_layers": 52,
        "intermediate_size": 21504,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "ssm_state_size": 128,
        "n_groups": 8,
        "conv_kernel": 4,
        "chunk_size": 128,
        "attention_bias": False,
        "mamba_proj_bias": False,
        "mlp_bias": False,
        "use_bias": False,
        "use_conv_bias": True,
        "mlp_hidden_act": "relu2",
        "layer_norm_epsilon": 1e-5,
        "max_position_embeddings": 131072,
        "vocab_size": 131072,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    # Qwen/Qwen3-Next-80B-A3B's layer stack with 64 experts where it has 512 (~12B parameters,
    # so both servers fit one GPU): 3 gated-delta layers to 1 gated attention layer.
    "qwen3-next-class": {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "full_attention_interval": 4,
        "intermediate_size": 5120,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "num_experts": 64,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "partial_rotary_factor": 0.25,
        "rope_theta": 10000000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
}
# Toy sizes of the same families, for runs on a CPU: tests/families.py's configs.
TINY = {"tiny-gemma3": "gemma3", "tiny-hybrid": "nemotron_h", "tiny-qwen3-next": "qwen3_next"}
NAMES = (*SHAPES, *TINY)


def _tests_module(name: str):
    # tests/ is not a package; its model builders are plain modules meant to be shared.
    sys.path.insert(0, str(ROOT / "tests"))
    return importlib.import_module(name)


def family_config(shape: str) -> dict:
    """The config.json fields of `shape` (a name in NAMES), less the special token ids."""
    if shape in SHAPES:
        return dict(SHAPES[shape])
    families = _tests_module("families")
    vocab = _tests_module("tiny_model").VOCAB_SIZE
    return {**families.FAMILIES[TINY[shape]], "vocab_size": vocab, "torch_dtype": "float32"}


def model_weights(config: dict, seed: int) -> Iterator[tuple[str, object]]:
    """(name, lazy array) for every weight of `config`'s mlx-lm `Model`, in mlx-lm's layout.

    MLX draws arrays lazily: nothing is computed until the shard writer evaluates them, so a
    30 GB model never sits in memory whole. The dtype is the config's, except where mlx-lm's
    own conversion keeps float32 (the model's `cast_predicate`, e.g. Mamba's A_log).
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten

    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    dtype = getattr(mx, config["torch_dtype"])
    cast = getattr(model, "cast_predicate", lambda name: True)
    for name, w in tree_flatten(model.parameters()):
        if name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue  # a tied checkpoint has none: the model reads the embeddings
        floating = mx.issubdtype(w.dtype, mx.floating)
        yield name, w.astype(dtype) if floating and cast(name) else w
