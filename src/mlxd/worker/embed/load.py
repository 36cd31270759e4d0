"""Load a decoder embedding model through mlx-lm without its language-model head.

Embedding checkpoints differ from chat ones in two ways mlx-lm's strict loader refuses: the
official Qwen3-Embedding folders store the backbone with flat keys (`layers.0...`, not
`model.layers.0...`), and some are untied yet ship no `lm_head` at all. The model class is
wrapped so that its sanitize step adds the missing prefix and drops the head (its weights too:
embeddings never use it, and an untied head of a 150k vocabulary is a large share of memory).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.utils import _get_classes, load_model, load_tokenizer

from mlxd.shared.model_facts import ModelFacts
from mlxd.worker.model.load import (
    LoadedModel,
    SamplingDefaults,
    context_of,
    held_arrays,
    upcast_on_the_cpu,
)

log = logging.getLogger("mlxd.worker.embed")

# The backbone's own weight names, seen at the top level of a flat checkpoint.
_BACKBONE_ROOTS = ("embed_tokens.", "layers.", "norm.")
# The worker's limit when the config states no context length.
FALLBACK_CONTEXT = 32768


def _prefixed(weights: dict[str, Any]) -> dict[str, Any]:
    """Flat backbone keys get the `model.` prefix mlx-lm's model classes expect."""
    if any(k.startswith("model.") for k in weights) or not any(
        k.startswith(_BACKBONE_ROOTS) for k in weights
    ):
        return weights
    return {f"model.{k}" if k.startswith(_BACKBONE_ROOTS) else k: v for k, v in weights.items()}


def headless_classes(config: dict) -> tuple[type, type]:
    """mlx-lm's model class for `config`, loading without its language-model head."""
    model_class, args_class = _get_classes(config)

    class Headless(model_class):  # type: ignore[misc, valid-type]
        def sanitize(self, weights):
            weights = _prefixed(weights)
            if hasattr(super(), "sanitize"):
                weights = super().sanitize(weights)
            if "lm_head" in self:
                del self.lm_head
            return {k: v for k, v in weights.items() if not k.startswith("lm_head.")}

    Headless.__name__ = f"Headless{model_class.__name__}"
    return Headless, args_class


def backbone(model) -> Any:
    """The part of an mlx-lm model that maps token ids to final (normed) hidden states."""
    inner = getattr(model, "model", None)
    if inner is None or not callable(inner):
        raise ValueError(f"{type(model).__name__} has no backbone (`.model`) to embed with")
    return inner


def load_embedder(
    path: Path, model_id: str, facts: ModelFacts, context_limit: int | None = None
) -> LoadedModel:
    """Load `path` as an embedding model; raises on any problem (the caller maps it to an
    exit code)."""
    if facts.encoder_only:
        raise ValueError(
            f"{facts.model_type} is an encoder model; mlxd serves decoder embedding models "
            "through mlx-lm only (docs/api.md)"
        )
    model, config = load_model(path, get_model_classes=headless_classes)
    backbone(model)  # fail at load, not at the first request
    tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    upcast_on_the_cpu(model)
    mx.eval(held_arrays(model))  # on the loading thread: requests run on another
    limit = context_of(facts.context_length or FALLBACK_CONTEXT, context_limit)
    log.info("embedding model=%s pooling=%s width=%s", model_id, facts.pooling, facts.hidden_size)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        config=config,
        model_id=model_id,
        path=path,
        context_limit=limit,
        defaults=SamplingDefaults(),  # an embedder samples nothing
    )
