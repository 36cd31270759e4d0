"""GGUF to mlx-lm llama: tensor names, config.json and weights (Q/K rows un-permuted).

`mx.load` already maps Q4_0 / Q4_1 / Q8_0 blocks onto MLX affine quantization, so quantized
tensors stay quantized: here they get mlx-lm's llama names and a per-layer quantization config.
"""

from __future__ import annotations

import re

import mlx.core as mx

from mlxd.worker.importers.gguf_file import GROUP_SIZE, KEPT_BITS, GGUFImportError, meta_value

# GGUF tensor name (after "blk.N.") -> mlx-lm llama module path; the inverse of mlx_lm.gguf.
LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def module_path(gguf_name: str) -> str:
    """The mlx-lm module path of a GGUF tensor; GGUFImportError when llama has none."""
    base = gguf_name.removesuffix(".weight")
    if m := re.fullmatch(r"blk\.(\d+)\.(\w+)", base):
        if m.group(2) in LAYER_NAMES:
            return f"model.layers.{m.group(1)}.{LAYER_NAMES[m.group(2)]}"
    elif base in TOP_NAMES:
        return TOP_NAMES[base]
    if base == "rope_freqs":
        raise GGUFImportError("unsupported tensor rope_freqs (Llama 3.1-style rope scaling)")
    raise GGUFImportError(f"unsupported tensor {gguf_name}: no llama counterpart")


def build_config(meta: dict, arch: str) -> dict:
    """config.json for mlx-lm's llama model from the GGUF's `<arch>.*` metadata."""
    n_heads = int(meta_value(meta, f"{arch}.attention.head_count"))
    hidden = int(meta_value(meta, f"{arch}.embedding_length"))
    head_dim = int(meta_value(meta, f"{arch}.attention.key_length", hidden // n_heads))
    if int(meta_value(meta, f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise GGUFImportError("unsupported partial rotary embedding (rope.dimension_count)")
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_attention_heads": n_heads,
        "head_dim": head_dim,
        "num_hidden_layers": int(meta_value(meta, f"{arch}.block_count")),
        "intermediate_size": int(meta_value(meta, f"{arch}.feed_forward_length")),
        "num_key_value_heads": int(meta_value(meta, f"{arch}.attention.head_count_kv", n_heads)),
        # GGUF stores float32: 7 digits give back the 1e-05 the model was trained with
        "rms_norm_eps": float(
            f"{meta_value(meta, f'{arch}.attention.layer_norm_rms_epsilon'):.7g}"
        ),
        "rope_theta": float(meta_value(meta, f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta_value(meta, f"{arch}.context_length", 4096)),
        "vocab_size": len(meta_value(meta, "tokenizer.ggml.tokens")),
        # Q/K rows are un-permuted in convert_weights, so the standard (non-interleaved) rope.
        "rope_traditional": False,
    }
    scaling = meta_value(meta, f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        factor = float(meta_value(meta, f"{arch}.rope.scaling.factor"))
        config["rope_scaling"] = {"type": "linear", "factor": factor}
    elif scaling != "none":
        raise GGUFImportError(f"unsupported rope scaling type {scaling!r}")
    if (bos := meta_value(meta, "tokenizer.ggml.bos_token_id", None)) is not None:
        config["bos_token_id"] = int(bos)
    # eot/eom end a turn in chat models (Llama 3); mlx-lm stops on every id listed here.
    eos = [
        int(v)
        for k in ("eos", "eot", "eom")
        if (v := meta_value(meta, f"tokenizer.ggml.{k}_token_id", None)) is not None
    ]
    if eos:
        config["eos_token_id"] = eos[0] if len(set(eos)) == 1 else sorted(set(eos))
    return config


def _unpermute_rows(w: mx.array, n_heads: int) -> mx.array:
    # llama.cpp's converter interleaves each head's rows for its rope layout:
    # reshape(n, 2, d/2).swapaxes(1, 2). This is its inverse. Quantization groups run along
    # the input dim, so the same row permutation applies to packed weights, scales and biases.
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def convert_weights(
    raw: dict, tensor_types: dict[str, int], config: dict
) -> tuple[dict[str, mx.array], dict]:
    """Rename GGUF tensors to mlx-lm names; return (weights, quantization config)."""
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    weights, bits_of = {}, {}
    for name, value in raw.items():
        gguf_name, suffix = name.rsplit(".", 1)
        ggml_type = tensor_types.get(f"{gguf_name}.weight", tensor_types.get(name))
        path = module_path(f"{gguf_name}.weight")
        if role := re.fullmatch(r"blk\.\d+\.(attn_[qk])", gguf_name):
            value = _unpermute_rows(value, heads[role.group(1)])
        if value.dtype in (mx.float32, mx.bfloat16):
            # One float dtype: float32 norms next to float16 scales would promote every
            # activation to float32 and slow decoding down for no quality gain.
            value = value.astype(mx.float16)
        weights[f"{path}.{suffix}"] = value
        if ggml_type is not None and value.ndim == 2 and suffix == "weight":
            bits_of[path] = KEPT_BITS[ggml_type]
    config["tie_word_embeddings"] = "lm_head.weight" not in weights
    expected = {f"{p}.weight" for p in TOP_NAMES.values() if p != "lm_head"} | {
        f"model.layers.{i}.{p}.weight"
        for i in range(config["num_hidden_layers"])
        for p in LAYER_NAMES.values()
    }
    if missing := sorted(expected - weights.keys()):
        raise GGUFImportError(f"GGUF lacks {len(missing)} llama tensor(s), e.g. {missing[0]}")
    quantized = [b for b in bits_of.values() if b]
    if not quantized:
        return weights, {}
    bits = max(set(quantized), key=quantized.count)  # the most common type is the default
    quant = {"group_size": GROUP_SIZE, "bits": bits}
    for path, b in sorted(bits_of.items()):  # per-layer overrides, read by mlx-lm's loader
        if b != bits:
            quant[path] = {"group_size": GROUP_SIZE, "bits": b} if b else False
    return weights, quant
