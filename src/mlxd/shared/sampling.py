"""The sampling parameters a model may default, each declared once.

`SamplingFields` holds each one's name and bounds; every place that takes them inherits it: a
model's config section (shared/config.py), the worker's launch spec (shared/worker_spec.py) and
every surface's request body (shared/wire/). `BUILTIN` holds each one's value when neither the
request, the config section nor the folder's generation_config.json sets it (mlx-lm's own).
`resolve` is the one order of precedence (request, then the config section, then the folder,
then BUILTIN): the worker resolves a model's defaults when it loads it and each request over
them; the supervisor resolves the same defaults for /admin/models/{id} (the dashboard's
playground starts from them). Pure: no MLX.

A new parameter is a field here, its entry in BUILTIN, its GenerationParams field and the
sampler (worker/engine/sampling.py); a surface whose API spells or bounds it differently
re-declares that one field (Anthropic's temperature, at most 1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field


class SamplingFields(BaseModel):
    """Sampling a request may set and a model may default (None: not set here)."""

    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    # -1 or None: the model's default; 0: no top-k (checked against the vocabulary later)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)


NAMES: tuple[str, ...] = tuple(SamplingFields.model_fields)
BUILTIN: dict[str, float | int] = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
assert set(BUILTIN) == set(NAMES), "every sampling field needs its built-in default"


def sampling_of(obj: Any) -> dict[str, Any]:
    """The sampling fields of a request, config section or spec, as keyword arguments."""
    return {name: getattr(obj, name) for name in NAMES}


def folder_defaults(generation_config: dict[str, Any]) -> dict[str, float | int]:
    """What a folder's generation_config.json sets (`do_sample: false` is greedy)."""
    out: dict[str, float | int] = {}
    if generation_config.get("do_sample") is False:
        out["temperature"] = 0.0
    for name in NAMES:
        value = generation_config.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = type(BUILTIN[name])(value)
    return out


def resolve(*layers: dict[str, Any]) -> dict[str, float | int]:
    """Each parameter from the first layer that sets it (not None, not -1 for top_k), else
    its built-in value: resolve(request, config section, folder)."""
    out: dict[str, float | int] = {}
    for name in NAMES:
        out[name] = BUILTIN[name]
        for layer in layers:
            value = layer.get(name)
            if value is not None and not (name == "top_k" and value < 0):
                out[name] = value
                break
    return out


@dataclass
class SamplingDefaults:
    """What a request that is silent gets: every sampling field resolved, and the model's
    max_tokens and system prompt (None: up to the context's end; none)."""

    sampling: dict[str, float | int] = field(default_factory=resolve)
    max_tokens: int | None = None
    system: str | None = None

    def flat(self) -> dict[str, Any]:
        """One mapping, as /admin/models/{id} and mlxctl show list them."""
        return {**self.sampling, "max_tokens": self.max_tokens, "system": self.system}


def read_generation_config(path: Path) -> dict[str, Any]:
    """A folder's generation_config.json ({} when it is missing or not an object)."""
    try:
        gen = json.loads((path / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    return gen if isinstance(gen, dict) else {}


def read_defaults(path: Path) -> SamplingDefaults:
    """The folder's generation_config.json over the built-in values."""
    return SamplingDefaults(resolve(folder_defaults(read_generation_config(path))))


def resolve_defaults(path: Path, section: dict[str, Any]) -> SamplingDefaults:
    """`path`'s defaults with the config section's set values over them."""
    folder = folder_defaults(read_generation_config(path))
    return SamplingDefaults(
        resolve(section, folder), section.get("max_tokens"), section.get("system")
    )
