"""GGUF tensors to mlx-lm weights, one tensor at a time.

Names: mlx-lm's model for the config lists the parameters it wants (HF names); llama.cpp's own
table (`gguf.get_tensor_name_map`, the one its converter writes with) gives each one's GGUF name.
Values: Q4_0 / Q4_1 / Q8_0 blocks are repacked bit-exactly into MLX affine quantization (group
size 32); other block types are dequantized (`gguf.quants`) and quantized with `mx.quantize`;
float tensors stay floats. The fix-ups are those of transformers' GGUF loader: llama's Q/K rows
are un-permuted, Gemma's norms were stored as `1 + w`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

import gguf
import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as T
from mlx.utils import tree_flatten

from mlxd.worker.importers.gguf_file import (
    ACCEPTED,
    FLOAT_TYPES,
    GROUP_SIZE,
    KEPT_BITS,
    REQUANT_BITS,
    GGUFFile,
    GGUFImportError,
    supported_types,
    type_name,
)

_PERMUTED = re.compile(r"blk\.\d+\.attn_([qk])\.weight")


@dataclass
class TensorPlan:
    """Which GGUF tensor becomes which mlx-lm weight, and how."""

    names: dict[str, str]  # GGUF tensor name -> mlx-lm parameter name
    dtype: mx.Dtype  # the one float type of the folder
    heads: dict[str, int] = field(default_factory=dict)  # "q"/"k" -> heads, when un-permuting
    norm_offset: float = 0.0  # subtracted from norm weights (Gemma stores 1 + w)


def plan_tensors(f: GGUFFile, config: dict) -> TensorPlan:
    """Map every tensor the model needs to its GGUF name; GGUFImportError on a gap."""
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config)
    # cast: tree_flatten returns this list without a `destination` (its annotation allows a dict)
    flat = tree_flatten(model_class(args_class.from_dict(config)).parameters())
    wanted = [k for k, _ in cast(list[tuple[str, Any]], flat)]
    arch_id = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}.get(f.arch, gguf.MODEL_ARCH.LLAMA)
    table = gguf.get_tensor_name_map(arch_id, int(config["num_hidden_layers"]))
    names, missing = {}, []
    for param in wanted:
        base, suffix = param.rsplit(".", 1)
        gguf_base = table.get_name(base)
        name = f"{gguf_base}.{suffix}" if gguf_base else None
        if name in f.tensors:
            names[name] = param
        elif not (param.startswith("lm_head.") and config["tie_word_embeddings"]):
            missing.append(name or param)
    if missing:
        raise GGUFImportError(
            f"GGUF lacks {len(missing)} tensor(s) the model needs, e.g. {missing[0]}"
        )
    for name in f.tensors:
        ttype = f.tensor_type(name)
        if name in names and ttype not in ACCEPTED:
            raise GGUFImportError(
                f"unsupported tensor type {type_name(ttype)} (tensor {name}); "
                f"supported: {supported_types()}"
            )
    gemma = config["model_type"].startswith("gemma")
    bf16 = gemma or any(f.tensor_type(n) == T.BF16 for n in names)
    plan = TensorPlan(names, mx.bfloat16 if bf16 else mx.float16, norm_offset=1.0 if gemma else 0)
    if f.arch in ("llama", "mistral"):  # llama.cpp interleaves these heads' rows for its rope
        plan.heads = {"q": config["num_attention_heads"], "k": config["num_key_value_heads"]}
    return plan


def convert_tensor(f: GGUFFile, name: str, plan: TensorPlan) -> tuple[dict[str, mx.array], int]:
    """One GGUF tensor as mlx-lm weights ({name: array}, evaluated) and its bits (0: float)."""
    param = plan.names[name]
    path = param.rsplit(".", 1)[0]
    ttype = f.tensor_type(name)
    heads = plan.heads.get(m.group(1)) if (m := _PERMUTED.fullmatch(name)) else None
    if ttype in KEPT_BITS and param.endswith(".weight"):
        w, scales, biases = _repack(f.blocks(name), T(ttype))
        if heads:
            w, scales, biases = (_unpermute_rows(a, heads) for a in (w, scales, biases))
        out = {
            param: mx.array(w),
            f"{path}.scales": mx.array(scales).astype(plan.dtype),
            f"{path}.biases": mx.array(biases).astype(plan.dtype),
        }
        return out, KEPT_BITS[T(ttype)]
    x = f.dequantized(name)
    if heads:
        x = _unpermute_rows(x, heads)
    if plan.norm_offset and name.endswith("norm.weight"):
        x = x - plan.norm_offset
    value = mx.array(x).astype(plan.dtype)
    bits = REQUANT_BITS.get(T(ttype), 0) if ttype not in FLOAT_TYPES else 0
    if bits and value.ndim == 2 and value.shape[-1] % GROUP_SIZE == 0:
        qw, qscales, qbiases = mx.quantize(value, group_size=GROUP_SIZE, bits=bits)
        out = {param: qw, f"{path}.scales": qscales, f"{path}.biases": qbiases}
    else:
        out, bits = {param: value}, 0
    mx.eval(out)
    return out, bits


def quantization_config(bits_of: dict[str, int]) -> dict:
    """config.json's "quantization": the most common bits, and per-layer overrides."""
    quantized = [b for b in bits_of.values() if b]
    if not quantized:
        return {}
    bits = Counter(quantized).most_common(1)[0][0]
    quant: dict = {"group_size": GROUP_SIZE, "bits": bits}
    for path, b in sorted(bits_of.items()):  # read by mlx-lm's loader, per module path
        if b != bits:
            quant[path] = {"group_size": GROUP_SIZE, "bits": b} if b else False
    return quant


def _repack(blocks: np.ndarray, ttype: T) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GGUF Q4_0 / Q4_1 / Q8_0 rows as MLX affine (uint32 weights, scales, biases): the same
    values, since each is `scale * q + bias` over 32 weights."""
    rows = blocks.shape[0]
    _, block_bytes = gguf.GGML_QUANT_SIZES[ttype]
    b = blocks.reshape(rows, -1, block_bytes)
    d = b[..., :2].copy().view(np.float16)[..., 0]
    if ttype == T.Q8_0:
        q = (b[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return q.reshape(rows, -1).view(np.uint32), d, -128 * d.astype(np.float32)
    if ttype == T.Q4_1:
        bias, qs = b[..., 2:4].copy().view(np.float16)[..., 0], b[..., 4:]
    else:  # Q4_0: symmetric around 8
        bias, qs = -8 * d.astype(np.float32), b[..., 2:]
    # GGUF: byte j holds weights j (low nibble) and j + 16; MLX: weights 2j and 2j + 1.
    nibbles = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    packed = (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).astype(np.uint8)
    return packed.reshape(rows, -1).view(np.uint32), d, bias


def _unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    # llama.cpp's converter interleaves each head's rows for its rope layout:
    # reshape(n, 2, d/2).swapaxes(1, 2). This is its inverse. Quantization groups run along
    # the input dim, so the same row permutation applies to packed weights, scales and biases.
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
