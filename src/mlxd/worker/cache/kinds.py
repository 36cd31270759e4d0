"""The layer kinds an SSD entry holds, their tensors' names and what each must look like.

A model's layout (kv_arrays.kv_layout) has one tuple per cache layer:
- attention KV (mlx-lm's KVCache): `(key heads, key dim, value heads, value dim, dtype)`;
  tensors `<i>.k` and `<i>.v` of shape (1, heads, tokens, dim);
- quantized KV: the same plus `(bits, group size)`, each side a packed `<i>.k` (uint32) with
  `<i>.k.scales` and `<i>.k.biases` (the float dtype);
- a sliding window (RotatingKVCache): `("rotating", key heads, key dim, value heads, value
  dim, dtype, window, keep)`; its buffer as held, `<i>.k` and `<i>.v` (about the window's
  length, in the cache's own order), and `<i>.rot` = (offset, keep, window, write index);
- a recurrent state (ArraysCache: gated delta, Mamba): `("arrays", (shape, dtype), ...)`,
  one entry per slot without its batch axis; tensors `<i>.a<j>` of shape (1, *shape).
The first two trim to any shorter prefix; the last two are snapshots of exactly their tokens,
reused only by a prompt that extends them (`trims`). bfloat16 travels as its uint16 bits
(NumPy has no bfloat16). Pure NumPy: the format's checks run off the engine thread.
"""

from __future__ import annotations

import numpy as np

BF16_STORED = "uint16"  # NumPy has no bfloat16: its bits travel as uint16
QUANT_PARTS = ("", ".scales", ".biases")  # a quantized K or V: packed values, scales, biases
ROTATING, ARRAYS = "rotating", "arrays"
ROT_FIELDS = 4  # offset, keep, window, write index


class LayoutMismatch(ValueError):
    """An entry whose arrays do not fit the model as loaded."""


def kind(layer: tuple) -> str:
    """ "kv", "quant", ROTATING or ARRAYS."""
    if layer and isinstance(layer[0], str):
        return layer[0]
    return "quant" if len(layer) == 7 else "kv"


def trims(layout: tuple) -> bool:
    """Whether every layer can be cut to a shorter prefix (attention KV, plain or quantized)."""
    return all(kind(layer) in ("kv", "quant") for layer in layout)


def _kv(kh: int, kd: int, vh: int, vd: int, dtype: str, length, quant=()) -> dict:
    if not quant:
        return {"k": ((1, kh, length, kd), dtype), "v": ((1, vh, length, vd), dtype)}
    bits, group = quant
    out: dict = {}
    for side, heads, dim in (("k", kh, kd), ("v", vh, vd)):
        out[side] = ((1, heads, length, dim * bits // 32), "uint32")
        for suffix in QUANT_PARTS[1:]:
            out[side + suffix] = ((1, heads, length, dim // group), dtype)
    return out


def expected(layer: tuple, n_tokens: int) -> dict[str, tuple[tuple, str]]:
    """One layer's tensors for an entry of `n_tokens`, as (shape, dtype) by name suffix; a
    window's buffer length is None (checked in check_layer)."""
    k = kind(layer)
    if k == ROTATING:
        _, kh, kd, vh, vd, dtype, _window, _keep = layer
        return {**_kv(kh, kd, vh, vd, dtype, None), "rot": ((ROT_FIELDS,), "int64")}
    if k == ARRAYS:
        return {f"a{j}": ((1, *shape), dtype) for j, (shape, dtype) in enumerate(layer[1:])}
    kh, kd, vh, vd, dtype, *quant = layer
    return _kv(kh, kd, vh, vd, dtype, n_tokens, tuple(quant))


def check_layer(i: int, layer: tuple, arrays: dict[str, np.ndarray], n_tokens: int) -> int:
    """Raise LayoutMismatch unless layer `i`'s tensors are what `layer` makes for `n_tokens`;
    returns how many tensors it has."""
    want = expected(layer, n_tokens)
    for suffix, (shape, dtype) in want.items():
        a = arrays.get(f"{i}.{suffix}")
        if a is None:
            raise LayoutMismatch(f"layer {i} is missing {suffix}")
        if a.dtype.name != dtype:
            raise LayoutMismatch(f"layer {i} holds {a.dtype.name}, the model makes {dtype}")
        if a.ndim != len(shape) or any(w is not None and w != s for w, s in zip(shape, a.shape)):
            raise LayoutMismatch(f"layer {i} has {suffix} of shape {a.shape}")
    if kind(layer) == ROTATING:
        _check_window(i, layer, arrays, n_tokens)
    return len(want)


def _check_window(i: int, layer: tuple, arrays: dict[str, np.ndarray], n_tokens: int) -> None:
    held = arrays[f"{i}.k"].shape[2]
    offset, keep, window, at = (int(x) for x in arrays[f"{i}.rot"])
    if arrays[f"{i}.v"].shape[2] != held or not 0 < held <= n_tokens:
        raise LayoutMismatch(f"layer {i} holds {held} positions of {n_tokens} tokens")
    if (offset, keep, window) != (n_tokens, layer[7], layer[6]) or not 0 <= at <= held:
        raise LayoutMismatch(f"layer {i}'s window state does not match the entry")
