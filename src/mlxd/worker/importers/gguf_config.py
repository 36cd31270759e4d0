"""config.json for mlx-lm from a GGUF's metadata.

The `<arch>.*` key names are renamed with transformers' GGUF mapping (GGUF_CONFIG_MAPPING, the
table `from_pretrained(gguf_file=...)` uses); what that table leaves out and mlx-lm needs (head
size, rope scaling, Gemma's soft-capping, end-of-turn ids) is filled in here per architecture.
"""

from __future__ import annotations

from typing import cast

import numpy as np

from mlxd.worker.importers.gguf_file import GGUFFile, GGUFImportError

# GGUF architecture -> mlx-lm model_type. Mistral GGUFs say "llama" (llama.cpp writes them so).
ARCHITECTURES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
}
_HF_CLASSES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}


def check_architecture(arch: str) -> str:
    """The mlx-lm model_type for a GGUF architecture; GGUFImportError naming the supported."""
    if arch not in ARCHITECTURES:
        raise GGUFImportError(
            f"unsupported architecture {arch!r}; supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    return ARCHITECTURES[arch]


def build_config(f: GGUFFile) -> dict:
    """config.json for mlx-lm's model of this file's architecture."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    arch = f.arch
    model_type = check_architecture(arch)
    config: dict = {"model_type": model_type, "architectures": [_HF_CLASSES[model_type]]}
    # cast: transformers' table mixes value types, so its values read as `object`
    mapping = cast(
        dict[str, str | None], GGUF_CONFIG_MAPPING.get(arch, GGUF_CONFIG_MAPPING["llama"])
    )
    for gguf_key, hf_key in mapping.items():
        if hf_key and (value := f.value(f"{arch}.{gguf_key}", None)) is not None:
            config[hf_key] = value
    for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size"):
        if key not in config:
            raise GGUFImportError(f"GGUF metadata lacks the {key} of {arch!r} (e.g. {arch}.*)")
    n_heads, hidden = int(config["num_attention_heads"]), int(config["hidden_size"])
    config.setdefault("num_key_value_heads", n_heads)
    head_dim = int(f.value(f"{arch}.attention.key_length", hidden // n_heads))
    config["head_dim"] = head_dim
    rotary = int(f.value(f"{arch}.rope.dimension_count", head_dim))
    if rotary != head_dim and model_type != "phi3":
        raise GGUFImportError("unsupported partial rotary embedding (rope.dimension_count)")
    if model_type == "phi3":
        config["partial_rotary_factor"] = rotary / head_dim
    # GGUF stores float32: 7 digits give back the 1e-05 the model was trained with
    config["rms_norm_eps"] = float(f"{float(config.get('rms_norm_eps', 1e-6)):.7g}")
    config["rope_theta"] = float(config.get("rope_theta", 10000.0))
    config.setdefault("max_position_embeddings", 4096)
    config["vocab_size"] = len(f.value("tokenizer.ggml.tokens"))
    config["rope_traditional"] = False  # llama's Q/K rows are un-permuted on import
    config["tie_word_embeddings"] = "output.weight" not in f.tensors
    _rope_scaling(f, arch, config)
    _architecture_extras(f, arch, model_type, config)
    _token_ids(f, config)
    return config


def _rope_scaling(f: GGUFFile, arch: str, config: dict) -> None:
    scaling = f.value(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        factor = float(f.value(f"{arch}.rope.scaling.factor"))
        config["rope_scaling"] = {"type": "linear", "rope_type": "linear", "factor": factor}
    elif scaling not in ("none", "", None):
        raise GGUFImportError(f"unsupported rope scaling type {scaling!r}")
    if "rope_freqs.weight" in f.tensors:
        config["rope_scaling"] = _llama3_rope(f, config)
    if any(n.startswith("rope_factors_") for n in f.tensors):
        raise GGUFImportError("unsupported long-context rope factors (rope_factors_long/short)")


def _llama3_rope(f: GGUFFile, config: dict) -> dict:
    """Llama 3.1+ stores its rope scaling as per-frequency factors; mlx-lm wants the recipe.

    The recipe's constants are the same for every Llama 3.x release, only the factor differs:
    rebuild the factors from it and accept the file only if they match.
    """
    stored = f.float_array("rope_freqs.weight").astype(np.float64)
    dims, base = config["head_dim"], config["rope_theta"]
    factor, low, high, old = float(stored.max()), 1.0, 4.0, 8192
    wavelens = 2 * np.pi * base ** (np.arange(0, dims, 2) / dims)
    smooth = (old / wavelens - low) / (high - low)
    expected = np.where(
        wavelens > old / low,
        factor,
        np.where(wavelens < old / high, 1.0, 1 / ((1 - smooth) / factor + smooth)),
    )
    if stored.shape != expected.shape or not np.allclose(stored, expected, rtol=1e-3):
        raise GGUFImportError("unsupported rope scaling (rope_freqs not from the Llama 3 recipe)")
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": old,
    }


def _architecture_extras(f: GGUFFile, arch: str, model_type: str, config: dict) -> None:
    if model_type in ("gemma2", "gemma3_text"):
        layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
        # llama.cpp scales queries by 1/sqrt(hidden/heads) on the 27B models, by the head size
        # otherwise; the file does not say which, the layer count does (46: Gemma 2 27B, 62: 3).
        big = layers in (46, 62)
        config["query_pre_attn_scalar"] = (
            config["hidden_size"] / heads if big else config["head_dim"]
        )
        window = f.value(f"{arch}.attention.sliding_window", None)
        if window is not None:
            config["sliding_window"] = int(window)
    if model_type == "gemma2":
        config["attn_logit_softcapping"] = float(f.value(f"{arch}.attn_logit_softcapping", 50.0))
        config["final_logit_softcapping"] = float(f.value(f"{arch}.final_logit_softcapping", 30.0))
    if model_type == "gemma3_text":
        config["rope_local_base_freq"] = 10000.0  # Gemma 3's local layers; not in the file
        config["sliding_window_pattern"] = 6
    if model_type == "phi3":
        config["original_max_position_embeddings"] = int(
            f.value(
                f"{arch}.rope.scaling.original_context_length", config["max_position_embeddings"]
            )
        )


def _token_ids(f: GGUFFile, config: dict) -> None:
    if (bos := f.value("tokenizer.ggml.bos_token_id", None)) is not None:
        config["bos_token_id"] = int(bos)
    # eot/eom end a turn in chat models (Llama 3); mlx-lm stops on every id listed here.
    eos = [
        int(v)
        for k in ("eos", "eot", "eom")
        if (v := f.value(f"tokenizer.ggml.{k}_token_id", None)) is not None
    ]
    if eos:
        config["eos_token_id"] = eos[0] if len(set(eos)) == 1 else sorted(set(eos))


# Sampling by general.basename (or basename-size_label): a GGUF carries none, and mlxd's
# fallback (temperature 1.0, top_p 1.0) is too hot for a small model.
RECOMMENDED_SAMPLING: dict[str, dict[str, bool | float]] = {
    # HuggingFaceTB/SmolLM2-*-Instruct: the model card's recommendation
    "smollm2": {"do_sample": True, "temperature": 0.2, "top_p": 0.9},
    # The built-in model (135M, Q4_1): behind its template's default system prompt the first
    # token is a near tie ("The" 0.55, "L" 0.36 even at temperature 0.2), so one answer in
    # three wanders off into French; greedy answers "The capital of France is Paris."
    "smollm2-135m": {"do_sample": False},
}


def generation_config(f: GGUFFile, config: dict) -> dict:
    """generation_config.json: the token ids, and the recommended sampling where known."""
    gen: dict = {k: config[k] for k in ("bos_token_id", "eos_token_id") if k in config}
    basename = str(f.value("general.basename", "") or "").lower()
    sized = f"{basename}-{f.value('general.size_label', '') or ''}".lower()
    if recommended := RECOMMENDED_SAMPLING.get(sized, RECOMMENDED_SAMPLING.get(basename)):
        gen.update(recommended)
    return gen
