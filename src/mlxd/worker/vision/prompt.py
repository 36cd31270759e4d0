"""A chat's rendered text and its images through the family's processor: the prompt ids the
engine runs (each image's tokens as its content ids, ids.py) and what its vision tower needs.

mlx-vlm's own `prepare_inputs` does the work (resizing, normalizing, expanding each image
marker into the image's tokens) so a row's inputs are the ones mlx-vlm's generate makes.
Runs off the event loop (a thread): resizing a large photo takes milliseconds. Arrays stay
NumPy here; the engine thread makes them MLX arrays when it encodes the row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mlxd.worker.vision.ids import content_ids
from mlxd.worker.vision.load import VisionParts

_IDS = ("input_ids", "attention_mask")


@dataclass
class VisionInput:
    """One row's images as its vision tower takes them: the processor's ids (image tokens as
    the model's image token), pixel values and the family's extras (e.g. image sizes), and
    each image's content hash."""

    ids: list[int]
    arrays: dict[str, np.ndarray]
    hashes: list[str]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def _longest_edge(processor) -> int | None:
    """The longest side a processor shrinks an image to keeping its aspect ratio (Pixtral's
    `size["longest_edge"]`), or None for one that resizes to a fixed shape (Gemma 3)."""
    size = getattr(getattr(processor, "image_processor", None), "size", None)
    edge = size.get("longest_edge") if isinstance(size, dict) else None
    if edge is None:
        edge = getattr(size, "longest_edge", None)
    return int(edge) if edge else None


def fit_aspect(parts: VisionParts, image: Any) -> Any:
    """`image`, or a strip of one too thin for the family's resize: one that keeps the aspect
    ratio (Pixtral's, to its longest edge) rounds the short side of a 1×4000 strip down to
    0 px, and mlx-vlm's processor fails on it. Such a strip is shrunk here to the longest
    edge and one pixel across, what that resize would make of it with the short side kept
    at one pixel (an image in a conversation's history that failed would fail every later
    turn). Shrunk, never padded: a 1×50,000,000 PNG is a few kB, its padding gigabytes."""
    edge = _longest_edge(parts.processor)
    width, height = image.size
    long = max(width, height)
    # The processor keeps floor(short * edge / long) pixels across; this many keep one (a
    # pixel's margin for its float division).
    if edge is None or long <= edge or min(width, height) >= long // edge + 1:
        return image
    from PIL import Image

    size = (edge, 1) if width >= height else (1, edge)
    return image.resize(size, Image.Resampling.BICUBIC)


def process(parts: VisionParts, text: str, images: list[Any], hashes: list[str]):
    """(the prompt's ids for the engine, its VisionInput). ValueError when the text holds
    another number of image markers than images were sent."""
    from mlx_vlm.utils import prepare_inputs

    out = prepare_inputs(
        parts.processor,
        images=[fit_aspect(parts, img) for img in images],
        prompts=text,
        image_token_index=parts.image_id,
        add_special_tokens=parts.add_special_tokens,
        return_tensors="np",
    )
    ids = [int(t) for t in np.asarray(out["input_ids"]).reshape(-1)]
    arrays = {k: np.asarray(v) for k, v in out.items() if k not in _IDS and v is not None}
    return content_ids(ids, parts.image_id, hashes, parts.inside), VisionInput(
        ids, arrays, list(hashes)
    )
