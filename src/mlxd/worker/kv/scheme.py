"""A model's KV scheme: its float dtype, or quantized (`kv_bits`).

A model whose config sets `kv_bits` gets `make_cache` (mlx-lm's hook in make_prompt_cache) set
to quantized row caches (quant.py), so every cache the worker makes (admission, warm-up, a
resumed row, the SSD layout probe) is quantized. Attention KV quantizes, also beside a hybrid's
recurrent states (which stay as they are); windows have no quantized form in mlx-lm, and MLA's
attention reads the cache's arrays itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, make_prompt_cache

from mlxd.worker.kv.quant import QuantizedRowCache


@dataclass(frozen=True)
class KvScheme:
    """How a model's KV is held: `bits` None is the model's float dtype."""

    bits: int | None = None
    group_size: int = 64

    @property
    def name(self) -> str:
        """The scheme in the SSD fingerprint ("kv-fp" is what entries before it used)."""
        return "kv-fp" if self.bits is None else f"kv-q{self.bits}g{self.group_size}"

    def row_cache(self) -> QuantizedRowCache:
        return QuantizedRowCache(group_size=self.group_size, bits=self.bits or 8)


def apply_kv_scheme(model, bits: int | None, group_size: int = 64) -> KvScheme:
    """Make `model`'s attention KV quantized; returns the scheme in effect.

    Attention KV layers (KVCache) become quantized row caches; recurrent states (ArraysCache,
    in hybrids) stay as they are, as mlx-lm's own `kv_bits` leaves them. A sliding window has
    no quantized form in mlx-lm, and an attention that reads the cache's arrays itself (MLA)
    cannot read one: ValueError for those, and for head dims the group size does not divide."""
    if bits is None:
        return KvScheme()
    caches = make_prompt_cache(model)
    if not any(type(c) is KVCache for c in caches) or not all(
        type(c) in (KVCache, ArraysCache) for c in caches
    ):
        kinds = sorted({type(c).__name__ for c in caches})
        raise ValueError(
            "kv_bits needs attention KV caches (with recurrent states beside them at most);"
            f" this model uses {', '.join(kinds)}"
        )
    dims = _head_dims(model)
    if any(d % group_size for d in dims):
        raise ValueError(f"kv_group_size {group_size} does not divide the head dims {dims}")
    scheme = KvScheme(bits, group_size)
    own = model.make_cache if hasattr(model, "make_cache") else None

    def make_cache() -> list:
        made = own() if own is not None else [KVCache() for _ in caches]
        return [scheme.row_cache() if type(c) is KVCache else c for c in made]

    model.make_cache = make_cache
    try:  # some attention reads the cache's arrays itself (DeepSeek's MLA): one token tells
        mx.eval(model(mx.array([[0]]), cache=make_prompt_cache(model)))
    except Exception as exc:
        del model.make_cache
        raise ValueError(
            f"kv_bits: this model's attention cannot read a quantized KV ({exc})"
        ) from exc
    return scheme


def _head_dims(model) -> list[int]:
    """The K and V head dims, from one token through a fresh plain cache."""
    caches = make_prompt_cache(model)
    model(mx.array([[0]]), cache=caches)
    kv = [c for c in caches if type(c) is KVCache]
    return sorted({c.keys.shape[-1] for c in kv} | {c.values.shape[-1] for c in kv})
