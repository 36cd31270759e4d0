"""The text model's token embedding, with each image row's features at its image positions.

mlx-lm's text model embeds ids; an image's positions hold content ids (ids.py) that no
embedding table has. `ImageEmbedding` takes the model's embedding's place: ids past the
vocabulary embed as the image token (a valid row, overwritten at once), and the features the
row hook placed for this forward (`Placed`) are written over their positions. A forward with
nothing placed (every decode step, every text-only prefill) is the original embedding's own
call, unchanged: no extra operation on the path that matters most.

`ImageRows` is the row hook (model/mlx_lm_seam.set_row_hook): before each prefill forward it
reads which rows run, where each row's chunk starts in its prompt and how long it is, and
places the features of the image positions inside those chunks. A row's features are
dropped once its last image position has been placed.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlxd.worker.model import blocks
from mlxd.worker.vision.ids import BASE


@dataclass
class Placed:
    """Features for the coming forward: its (rows, width), flat positions, feature rows."""

    shape: tuple[int, int]
    flat: mx.array
    feats: mx.array


class ImageEmbedding(nn.Module):
    """Wraps the text model's embedding (`inner`, kept as it is: tied heads call its
    `as_linear`)."""

    def __init__(self, inner: nn.Module, image_id: int):
        super().__init__()
        self.inner = inner
        self.image_id = image_id
        self._placed: Placed | None = None

    def place(self, placed: Placed | None) -> None:
        self._placed = placed

    def __call__(self, ids: mx.array) -> mx.array:
        placed, self._placed = self._placed, None
        if placed is None:
            return self.inner(ids)
        if tuple(ids.shape) != placed.shape:  # a forward the placement was not made for
            raise RuntimeError(f"image features placed for {placed.shape}, got {ids.shape}")
        h = self.inner(mx.where(ids >= BASE, self.image_id, ids))
        b, n, d = h.shape
        flat = h.reshape(b * n, d)
        flat[placed.flat] = placed.feats.astype(h.dtype)
        return flat.reshape(b, n, d)

    def as_linear(self, x: mx.array) -> mx.array:
        return self.inner.as_linear(x)


@dataclass
class RowImages:
    """One row's image positions still to prefill (ascending, absolute in its prompt) and
    their features, one row of `feats` per position."""

    positions: np.ndarray
    feats: mx.array


class ImageRows:
    """Each image row's features by generator uid, placed before every prefill forward."""

    def __init__(self, embedding: ImageEmbedding):
        self.embedding = embedding
        self.rows: dict[int, RowImages] = {}

    def bind(self, uid: int, row: RowImages | None) -> None:
        if row is not None:
            self.rows[uid] = row

    def unbind(self, uid: int) -> None:
        self.rows.pop(uid, None)

    def reset(self) -> None:
        self.rows.clear()
        self.embedding.place(None)

    @property
    def nbytes(self) -> int:
        return sum(r.feats.nbytes for r in self.rows.values())

    def __call__(self, uids: list[int], chunk: list[tuple[int, int]] | None) -> bool:
        """The seam's row hook; `chunk`: each row's (offset, length) in a prefill forward,
        None for a decode step (no image is ever decoded). Never an adapter: False.
        Whatever an earlier call placed is dropped first: a forward that never ran (a later
        hook raised, the step failed) must not hand its features to the next one."""
        self.embedding.place(None)
        if chunk is None or not self.rows:
            return False
        # the forward is as wide as its longest chunk, in whole blocks when those are on
        width = blocks.round_up(max((n for _, n in chunk), default=0))
        flat, feats = [], []
        for i, (uid, (off, n)) in enumerate(zip(uids, chunk, strict=True)):
            row = self.rows.get(uid)
            if row is None:
                continue
            lo, hi = np.searchsorted(row.positions, [off, off + n])
            if hi > lo:
                flat.append(i * width + row.positions[lo:hi] - off)
                feats.append(row.feats[int(lo) : int(hi)])
            if hi == len(row.positions):  # its last image is in: nothing left to place
                del self.rows[uid]
        if flat:
            self.embedding.place(
                Placed(
                    (len(uids), width),
                    mx.array(np.concatenate(flat).astype(np.uint32)),
                    mx.concatenate(feats) if len(feats) > 1 else feats[0],
                )
            )
        return False
