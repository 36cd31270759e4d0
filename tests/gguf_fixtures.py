"""Tiny GGUF files written with `gguf.GGUFWriter` the way llama.cpp's converter writes them.

`write_gguf(path, arch, types)` takes random weights under mlx-lm's (Hugging Face) names, applies
the converter's changes (llama's Q/K rows permuted for its rope, Gemma's norms stored as 1 + w),
renames them with llama.cpp's own table and stores each in the GGML type asked for. It returns
the reference weights, so a test can run mlx-lm on them directly and compare with the import.

K-quants: gguf's numpy code only decodes them, so Q6_K is encoded here, and Q4_K blocks are
random bytes with small scales (any bytes are a valid Q4_K block).
Plain module (no pytest), like tiny_model.py.
"""

from __future__ import annotations

import json
import pathlib

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from mlx.utils import tree_flatten

from tiny_model import MARKER_TOKENS, SPECIAL_TOKENS, _build_tokenizer

HIDDEN, HEADS, KV_HEADS, INTERMEDIATE = 256, 4, 2, 512  # K-quant rows: a multiple of 256
HEAD_DIM = HIDDEN // HEADS
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MODEL_TYPES = {"gemma3": "gemma3_text"}
LAYERS = {"gemma3": 6}  # mlx-lm's Gemma 3 needs one full sliding-window pattern; others: 2


def mlx_config(arch: str, vocab_size: int, tied: bool) -> dict:
    """The config the import should arrive at (mlx-lm names), used for the reference model."""
    config = {
        "model_type": MODEL_TYPES.get(arch, arch),
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS.get(arch, 2),
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": tied,
        "query_pre_attn_scalar": HEAD_DIM,
        "sliding_window": 512,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    }
    return config


def reference_weights(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights under the names mlx-lm's model for `config` wants."""
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    params = tree_flatten(model_class(args_class.from_dict(config)).parameters())
    rng = np.random.RandomState(seed)
    out = {}
    for name, p in params:
        if name.startswith("lm_head.") and config["tie_word_embeddings"]:
            continue
        if "norm" in name:
            out[name] = (1.0 + 0.1 * rng.standard_normal(p.shape)).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(p.shape) * 0.05).astype(np.float32)
    return out


def _permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def encode_q6_k(x: np.ndarray) -> np.ndarray:
    """float rows -> Q6_K bytes (rows, 210 per 256 weights): d * scale[16] * (q - 32)."""
    rows = x.shape[0]
    blocks = x.reshape(-1, 16, 16).astype(np.float32)
    sub = np.maximum(np.abs(blocks).max(axis=-1), 1e-8) / 31  # per 16 weights
    d = (sub.max(axis=-1) / 127).astype(np.float16)
    sc = np.clip(np.round(sub / d.astype(np.float32)[:, None]), 1, 127).astype(np.int8)
    step = d.astype(np.float32)[:, None, None] * sc[..., None]
    q = (np.clip(np.round(blocks / step), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 128)
    ql = (q[..., :64] & 0xF) | ((q[..., 64:] & 0xF) << 4)  # (n, 2 halves, 64)
    hi = (q >> 4).reshape(-1, 2, 4, 32)
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    out = np.concatenate(
        [
            ql.reshape(-1, 128),
            qh.reshape(-1, 64),
            sc.view(np.uint8),
            d.reshape(-1, 1).view(np.uint8),
        ],
        axis=-1,
    )
    return out.reshape(rows, -1)


def random_q4_k(rows: int, cols: int, rng: np.random.RandomState) -> np.ndarray:
    """Q4_K bytes (rows, 144 per 256 weights) of random blocks, values within about +-0.05."""
    blocks = rng.randint(0, 256, size=(rows * cols // 256, 144)).astype(np.uint8)
    blocks[:, 0:2] = np.array([6e-5], np.float16).view(np.uint8)  # d
    blocks[:, 2:4] = np.array([4e-4], np.float16).view(np.uint8)  # dmin
    return blocks.reshape(rows, -1)


def _store(name: str, x: np.ndarray, ttype: T, rng) -> tuple[np.ndarray, T | None]:
    if ttype == T.F32 or x.ndim == 1:
        return x.astype(np.float32), None
    if ttype == T.F16:
        return x.astype(np.float16), None
    if ttype == T.Q6_K:
        return encode_q6_k(x), T.Q6_K
    if ttype == T.Q4_K:
        return random_q4_k(*x.shape, rng), T.Q4_K
    try:
        return gguf.quants.quantize(x, ttype), ttype  # Q4_0 / Q4_1 / Q8_0 / Q5_0 ...
    except NotImplementedError:  # e.g. IQ2_XXS: random bytes, for refusal tests
        shape = gguf.quants.quant_shape_to_byte_shape(x.shape, ttype)
        return rng.randint(0, 256, size=shape).astype(np.uint8), ttype


def write_metadata_only(path: pathlib.Path, arch: str) -> None:
    """A GGUF with an architecture and no tensors: enough to be refused for the architecture."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tokenizer_model("gpt2")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gguf(
    path: pathlib.Path,
    arch: str,
    types: dict[str, T] | None = None,
    *,
    tied: bool = True,
    basename: str = "tiny",
    size_label: str = "1M",
    seed: int = 0,
    extra: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Write a tiny `arch` GGUF at `path`; `types` maps GGUF name patterns (substrings, e.g.
    "ffn_down") to GGML types, F32 otherwise; `extra` adds float tensors under GGUF names.
    Returns the reference weights (mlx-lm names)."""
    tok = _build_tokenizer()
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    kinds = {t: 3 for t in SPECIAL_TOKENS} | {t: 4 for t in MARKER_TOKENS}
    config = mlx_config(arch, len(tokens), tied)
    ref = reference_weights(config, seed)
    rng = np.random.RandomState(seed + 1)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_string("general.basename", basename)
    w.add_string("general.size_label", size_label)
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(HIDDEN)
    w.add_block_count(config["num_hidden_layers"])
    w.add_feed_forward_length(INTERMEDIATE)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_freq_base(config["rope_theta"])
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_dimension_count(HEAD_DIM)
    if arch.startswith("gemma"):
        w.add_sliding_window(config["sliding_window"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        w.add_final_logit_softcapping(config["final_logit_softcapping"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([kinds.get(t, 1) for t in tokens])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in model["merges"]])
    w.add_bos_token_id(tok.token_to_id("<|endoftext|>"))
    w.add_eos_token_id(tok.token_to_id("<|im_end|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    arch_id = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    table = gguf.get_tensor_name_map(arch_id, config["num_hidden_layers"])
    for name, x in ref.items():
        base, suffix = name.rsplit(".", 1)
        gname = f"{table.get_name(base)}.{suffix}"
        if arch == "llama" and gname.endswith(("attn_q.weight", "attn_k.weight")):
            x = _permute(x, HEADS if "attn_q" in gname else KV_HEADS)
        if arch.startswith("gemma") and gname.endswith("norm.weight"):
            x = x + 1.0  # llama.cpp's Gemma converter folds RMSNorm's (1 + w) into the file
        ttype = next((t for pat, t in (types or {}).items() if pat in gname), T.F32)
        data, raw = _store(gname, x, ttype, rng)
        w.add_tensor(gname, data, raw_dtype=raw)
    for gname, x in (extra or {}).items():
        w.add_tensor(gname, x.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ref
