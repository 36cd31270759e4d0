"""A model's request defaults: what a request that leaves a sampling field out gets.

Its config section's values (WorkerSpec MODEL_DEFAULT_FIELDS) win over the folder's
generation_config.json, which wins over the built-in values. Pure (no MLX): the worker resolves
them when it loads the model (worker/model.py) and the supervisor shows the same resolution in
/admin/models/{id} (the dashboard's playground starts from them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any


@dataclass
class SamplingDefaults:
    """What a request that is silent gets: the model's config section (WorkerSpec), else its
    generation_config.json, else these built-in values."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int | None = None  # None: up to the context's end
    system: str | None = None  # for a conversation without a system or developer message


def read_defaults(path: Path) -> SamplingDefaults:
    """The folder's generation_config.json over the built-in values (`do_sample: false` is
    greedy)."""
    d = SamplingDefaults()
    try:
        gen = json.loads((path / "generation_config.json").read_text())
    except (OSError, ValueError):
        return d
    if not isinstance(gen, dict):
        return d
    if gen.get("do_sample") is False:
        d.temperature = 0.0
    for key, cast in (("temperature", float), ("top_p", float), ("top_k", int), ("min_p", float)):
        if isinstance(gen.get(key), (int, float)) and not isinstance(gen.get(key), bool):
            setattr(d, key, cast(gen[key]))
    return d


def resolve_defaults(path: Path, overrides: dict[str, Any]) -> SamplingDefaults:
    """`path`'s defaults with the config section's set values (`overrides`) over them."""
    names = {f.name for f in fields(SamplingDefaults)}
    return replace(
        read_defaults(path), **{k: v for k, v in overrides.items() if k in names and v is not None}
    )
