"""A vision-language model folder: mlx-lm's text model plus mlx-vlm's vision tower and
projector, loaded without a second copy of the text weights.

The text model stays mlx-lm's (`mlx_lm.load` opens these folders and drops the vision weights),
so the engine batches, caches and quantizes image rows exactly as it does text rows. The
vision half is mlx-vlm's own model class for the family, built with `lazy=True` and its text
model replaced, before any weight is read, by a stub holding mlx-lm's embedding: mlx-vlm's
`get_input_embeddings` (its merge of text embeddings and image features, the oracle's own
code) then runs unchanged, and the text weights it listed are never read.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxd.shared.model_facts import VISION_FAMILIES, serves_images
from mlxd.worker.model import mlx_lm_seam as seam
from mlxd.worker.model.load import held_arrays
from mlxd.worker.vision.embed import ImageEmbedding, ImageRows
from mlxd.worker.vision.processor_memo import ProcessorMemo

log = logging.getLogger("mlxd.worker.vision")


class _Text(nn.Module):
    """What mlx-vlm's model reads of its text model: `model.embed_tokens`."""

    def __init__(self, embed_tokens: nn.Module):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = embed_tokens


@dataclass
class VisionParts:
    """A loaded model's vision half, and the text model's image embedding and row hook."""

    vlm: Any = field(repr=False)  # mlx-vlm's Model, its text model a stub (_Text)
    # the family's processor (images -> pixels, the prompt's image tokens)
    processor: Any = field(repr=False)
    model_type: str
    image_id: int  # the token the processor repeats per image feature
    inside: frozenset[int]  # tokens inside one image besides image tokens (row breaks)
    embedding: ImageEmbedding
    rows: ImageRows
    add_special_tokens: bool  # what mlx-vlm tokenizes the rendered prompt with


def vision_family(config: dict) -> str | None:
    """The folder's vision family when mlxd serves its images, else None."""
    return config["model_type"] if serves_images(config) else None


def load_vision(path: Path, model: nn.Module, tokenizer) -> VisionParts | None:
    """The vision half of a VLM folder `mlx_lm.load` gave `model` for, or None for a
    text-only folder, or when mlx-vlm is not installed (the `vision` extra: then images get
    a 400 saying so). Raises when the vision half of a served family does not load."""
    config = json.loads((Path(path) / "config.json").read_text())
    family = vision_family(config)
    if family is None:
        return None
    try:
        from mlx_vlm.utils import load_model, load_processor, should_add_special_tokens
    except ImportError as exc:
        log.warning(
            "vision: %s has a vision tower but mlx-vlm is missing (%s): text only; "
            "install mlxd[vision] for images",
            path,
            exc,
        )
        return None

    vlm = load_model(Path(path), lazy=True)
    image_id = int(vlm.config.image_token_index)
    embedding = seam.swap_embedding(model, lambda inner: ImageEmbedding(inner, image_id))
    vlm.language_model = _Text(embedding.inner)  # the text weights mlx-vlm listed go unread
    mx.eval(held_arrays(vlm))  # its parameters among them
    processor = load_processor(Path(path), add_detokenizer=False)
    if getattr(processor, "image_processor", None) is not None:  # each image resized once
        processor.image_processor = ProcessorMemo(processor.image_processor)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    inside = frozenset(vocab[t] for t in VISION_FAMILIES[family] if t in vocab)
    rows = ImageRows(embedding)
    seam.set_row_hook(model, rows, name="vision")
    log.info("vision: %s tower loaded (image token %d)", family, image_id)
    return VisionParts(
        vlm=vlm,
        processor=processor,
        model_type=family,
        image_id=image_id,
        inside=inside,
        embedding=embedding,
        rows=rows,
        add_special_tokens=bool(should_add_special_tokens(family, processor)),
    )
