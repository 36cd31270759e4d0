"""One targeted Linear of the base model, serving many LoRA adapters in one forward (S-LoRA).

The base matmul runs once for every row; each row then adds its own adapter's low-rank delta,
`scale[s] * ((x @ A[s]) @ B[s])` with `s` the row's slot, as mlx-lm's LoRALinear computes it
for one adapter (same order of operations, so a row gives mlx-lm's own tokens). Slot 0 is the
base: zero A and B, scale 0. The per-row slots are one array for the whole model (`Rows`), set
before every forward by the engine; a forward with no adapter row skips the delta altogether,
so a base-only batch runs exactly the base model's operations.

`mx.gather_mm` picks each row's A and B inside the matmul (no copy of them per row): one
kernel per factor however many adapters share the batch. MLX 0.32's CUDA backend fails that
kernel with per-row indices (`cudaGraphInstantiate ... misaligned address`, after which the
process's CUDA context is lost), so on CUDA each row's factors are taken first (`a[idx]`, a
rank-wide copy per row: kilobytes) and multiplied by a batched matmul in the same order.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from mlxd.worker.model.device import on_cuda


def take_rows() -> bool:
    """Whether the delta takes each row's factors before a batched matmul (CUDA) instead of
    `gather_mm` (Metal, CPU). Read at each forward: a test may force either path."""
    if TAKE_ROWS is not None:
        return TAKE_ROWS
    return on_cuda()


TAKE_ROWS: bool | None = None  # None: by the device (above)


class Rows:
    """Each row's adapter slot for the forward being built (None: no adapter row in it)."""

    def __init__(self) -> None:
        self.idx: mx.array | None = None


class Stack:
    """Every slot's factors for one layer: A (slots, in, rank), B (slots, rank, out), scale
    (slots,). Ranks differ between adapters: smaller ones are zero-padded (adds exact zeros)."""

    def __init__(self, in_dims: int, out_dims: int):
        self.in_dims, self.out_dims = in_dims, out_dims
        self.a: mx.array | None = None
        self.b: mx.array | None = None
        self.scale: mx.array | None = None

    @property
    def slots(self) -> int:
        return 0 if self.a is None else self.a.shape[0]

    def put(self, slot: int, a: mx.array, b: mx.array, scale: float) -> None:
        """Slot `slot` holds these factors (the stack grows to hold it)."""
        rank = a.shape[1]
        dtype = a.dtype if self.a is None or self.a.dtype == a.dtype else mx.float32
        self._grow(max(slot + 1, self.slots), max(rank, self._rank()), dtype)
        assert self.a is not None and self.b is not None and self.scale is not None
        self.a[slot] = mx.zeros_like(self.a[slot])
        self.b[slot] = mx.zeros_like(self.b[slot])
        self.a[slot, :, :rank] = a.astype(dtype)
        self.b[slot, :rank, :] = b.astype(dtype)
        self.scale[slot] = scale
        mx.eval(self.a, self.b, self.scale)

    def clear(self, slot: int) -> None:
        """Slot `slot` adds nothing any more (its adapter left)."""
        if self.a is None or slot >= self.slots:
            return
        assert self.b is not None and self.scale is not None
        self.a[slot] = mx.zeros_like(self.a[slot])
        self.b[slot] = mx.zeros_like(self.b[slot])
        self.scale[slot] = 0.0
        mx.eval(self.a, self.b, self.scale)

    def _rank(self) -> int:
        return 0 if self.a is None else self.a.shape[2]

    def _grow(self, slots: int, rank: int, dtype) -> None:
        if self.a is not None and (slots, rank) == (self.slots, self._rank()):
            if self.a.dtype == dtype:
                return
        a = mx.zeros((slots, self.in_dims, rank), dtype=dtype)
        b = mx.zeros((slots, rank, self.out_dims), dtype=dtype)
        scale = mx.zeros((slots,), dtype=mx.float32)
        if self.a is not None:
            assert self.b is not None and self.scale is not None
            n, r = self.slots, self._rank()
            a[:n, :, :r] = self.a.astype(dtype)
            b[:n, :r, :] = self.b.astype(dtype)
            scale[:n] = self.scale
        self.a, self.b, self.scale = a, b, scale


def dims_of(linear: nn.Module) -> tuple[int, int]:
    """(input, output) dimensions of a Linear or QuantizedLinear, as mlx-lm's LoRALinear
    reads them."""
    out_dims, in_dims = linear.weight.shape
    if isinstance(linear, nn.QuantizedLinear):
        in_dims = in_dims * 32 // linear.bits
    return in_dims, out_dims


class MultiLoRALinear(nn.Module):
    """A base Linear (or QuantizedLinear) plus every mounted adapter's delta for it.

    The factors live in a plain attribute (`stack`), not in the module tree: the model's
    parameters, their names and byte counts stay the base model's."""

    def __init__(self, base: nn.Module, rows: Rows):
        super().__init__()
        self.base = base
        in_dims, out_dims = dims_of(base)
        object.__setattr__(self, "stack", Stack(in_dims, out_dims))
        object.__setattr__(self, "rows", rows)

    def __call__(self, x: mx.array) -> mx.array:
        y = self.base(x)
        idx, st = self.rows.idx, self.stack
        if idx is None or st.a is None:
            return y
        assert st.b is not None and st.scale is not None
        # Slots past this layer's stack (adapters that do not target it) read slot 0.
        idx = mx.where(idx < st.slots, idx, 0)
        lead = x.shape[:-1]
        x3 = x.reshape(idx.shape[0], -1, x.shape[-1])
        if take_rows():
            z = (x3 @ st.a[idx]) @ st.b[idx]
        else:
            z = mx.gather_mm(mx.gather_mm(x3, st.a, None, idx), st.b, None, idx)
        scale = st.scale[idx].astype(z.dtype)[:, None, None]
        return y + (scale * z).astype(x.dtype).reshape(*lead, -1)
