"""A row's image features, on the engine thread as the row is admitted.

mlx-vlm's `get_input_embeddings` runs the family's vision tower and projector over the row's
pixels and merges the features into the prompt's embeddings exactly as mlx-vlm's generate
does; the rows at the image positions are the features this row's prefill writes (embed.py).
Only positions past the row's cached prefix are kept: a second turn about the same
screenshot, its image inside the cached prefix, encodes nothing at all.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from mlxd.worker.vision.embed import RowImages
from mlxd.worker.vision.ids import image_positions
from mlxd.worker.vision.load import VisionParts
from mlxd.worker.vision.prompt import VisionInput


def encode_row(
    parts: VisionParts, vin: VisionInput, prompt: list[int], cached: int
) -> RowImages | None:
    """Features for `prompt`'s image positions from `cached` on (None: all are cached)."""
    positions = image_positions(prompt)
    keep = positions >= cached
    if not keep.any():
        return None
    ids = mx.array([vin.ids])
    src = np.nonzero(np.asarray(vin.ids) == parts.image_id)[0]
    if len(src) != len(positions):  # the prompt was changed past the processor (a bug)
        raise ValueError(f"{len(positions)} image positions for {len(src)} image tokens")
    extra = {k: mx.array(v) for k, v in vin.arrays.items() if k != "pixel_values"}
    out = parts.vlm.get_input_embeddings(
        ids, mx.array(vin.arrays["pixel_values"]), mask=mx.ones_like(ids), **extra
    )
    embeds = getattr(out, "inputs_embeds", out)
    feats = embeds[0][mx.array(src[keep].astype(np.uint32))]
    mx.eval(feats)
    return RowImages(positions[keep], feats)
