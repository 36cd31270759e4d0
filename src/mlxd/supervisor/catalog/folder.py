"""What a model folder says about itself (config.json, generation_config.json), for
`mlxctl show`. Read only on request, a small prefix of each file at most."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MAX_JSON_BYTES = 1 << 20  # configs are a few KiB; never read a huge or odd file whole
GENERATION_KEYS = (
    "do_sample",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "max_new_tokens",
)
CONTEXT_KEYS = ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length")


def _json(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            data = json.loads(f.read(MAX_JSON_BYTES))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def generation_config(folder: Path) -> dict[str, Any]:
    """The sampling keys of the folder's generation_config.json (empty: none there)."""
    gen = _json(folder / "generation_config.json")
    return {k: gen[k] for k in GENERATION_KEYS if k in gen}


def architecture(folder: Path) -> dict[str, Any]:
    """model_type, architecture, context length and quantization from config.json."""
    cfg = _json(folder / "config.json")
    text = cfg.get("text_config")
    text = text if isinstance(text, dict) else {}
    out: dict[str, Any] = {}
    if "model_type" in cfg:
        out["model_type"] = cfg["model_type"]
    if isinstance(cfg.get("architectures"), list) and cfg["architectures"]:
        out["architecture"] = cfg["architectures"][0]
    for key in CONTEXT_KEYS:
        value = cfg.get(key, text.get(key))
        if isinstance(value, int):
            out["context_length"] = value
            break
    quant = cfg.get("quantization") or cfg.get("quantization_config")
    if isinstance(quant, dict):
        out["quantization"] = {k: quant[k] for k in ("bits", "group_size", "mode") if k in quant}
    return out
