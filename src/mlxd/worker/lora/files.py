"""An mlx-lm adapter folder, read and checked against the base model.

mlx-lm's `lora` command writes `adapters.safetensors` (one `<module path>.lora_a` (in, rank)
and `.lora_b` (rank, out) per adapted layer) and `adapter_config.json` (`fine_tune_type`,
`num_layers`, `lora_parameters`: rank, scale, dropout, keys). The safetensors keys name the
layers, so they, not the config's `keys`, say what the adapter touches. Every mistake is a
400 (404 for a missing folder) naming the file and what is wrong: mounting a bad adapter fails
that mount, and the worker serves on.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from mlxd.shared.errors import BadRequest, NotFound
from mlxd.worker.lora.layer import MultiLoRALinear, dims_of

CONFIG, WEIGHTS = "adapter_config.json", "adapters.safetensors"


class AdapterError(BadRequest):
    """An adapter that does not fit the base model (or is not LoRA)."""


@dataclass
class AdapterWeights:
    """One adapter's factors by module path, its scale, and what identifies its contents."""

    path: Path
    factors: dict[str, tuple[mx.array, mx.array]]  # module path -> (A, B)
    scale: float
    rank: int
    digest: str  # sha256 of the weights file: the prompt cache's namespace
    nbytes: int


def read_adapter(path: Path, model: nn.Module) -> AdapterWeights:
    """Read the folder at `path` and check every factor against `model`'s layers."""
    if not (path / WEIGHTS).is_file() or not (path / CONFIG).is_file():
        raise NotFound(f"No mlx-lm adapter at {path}: it needs {WEIGHTS} and {CONFIG}")
    try:
        config = json.loads((path / CONFIG).read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{path / CONFIG} is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{path / CONFIG} is not a JSON object")
    kind = config.get("fine_tune_type", "lora")
    if kind != "lora":
        raise AdapterError(f"{path}: fine_tune_type {kind!r} is not served (LoRA only)")
    params = config.get("lora_parameters") or {}
    if not isinstance(params, dict) or "scale" not in params:
        raise AdapterError(f"{path / CONFIG}: lora_parameters has no 'scale'")
    scale = params["scale"]
    # NaN or infinity would turn every logit of the adapter's rows into NaN.
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
        raise AdapterError(f"{path / CONFIG}: lora_parameters.scale must be a finite number")
    try:
        arrays = mx.load(str(path / WEIGHTS))
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the adapter's fault
        raise AdapterError(f"{path / WEIGHTS} could not be read: {exc}") from None
    assert isinstance(arrays, dict)  # a .safetensors file loads as a dict
    factors = _pair(path, arrays)
    modules = dict(model.named_modules())
    ranks = {_check(path, modules.get(m), m, a, b) for m, (a, b) in factors.items()}
    if not factors:
        raise AdapterError(f"{path / WEIGHTS} holds no LoRA factors")
    return AdapterWeights(
        path,
        factors,
        float(scale),
        max(ranks),
        hashlib.sha256((path / WEIGHTS).read_bytes()).hexdigest(),
        sum(a.nbytes + b.nbytes for a, b in factors.values()),
    )


def _pair(path: Path, arrays: dict[str, mx.array]) -> dict[str, tuple[mx.array, mx.array]]:
    out: dict[str, tuple[mx.array, mx.array]] = {}
    for key in arrays:
        module, _, leaf = key.rpartition(".")
        if leaf not in ("lora_a", "lora_b"):
            raise AdapterError(f"{path / WEIGHTS}: {key!r} is not a LoRA factor (lora_a, lora_b)")
        other = f"{module}.lora_b" if leaf == "lora_a" else f"{module}.lora_a"
        if other not in arrays:
            raise AdapterError(f"{path / WEIGHTS}: {key!r} has no {other!r}")
        out[module] = (arrays[f"{module}.lora_a"], arrays[f"{module}.lora_b"])
    return out


def _check(path: Path, layer: nn.Module | None, module: str, a: mx.array, b: mx.array) -> int:
    if isinstance(layer, MultiLoRALinear):
        layer = layer.base
    if not isinstance(layer, nn.Linear | nn.QuantizedLinear):
        what = "no such layer" if layer is None else f"a {type(layer).__name__}"
        raise AdapterError(f"{path}: {module!r} is {what} in the base model, not a Linear")
    in_dims, out_dims = dims_of(layer)
    rank = a.shape[-1] if a.ndim == 2 else -1
    if a.shape != (in_dims, rank) or b.shape != (rank, out_dims):
        raise AdapterError(
            f"{path}: {module!r} has lora_a {tuple(a.shape)} and lora_b {tuple(b.shape)}; the "
            f"base layer needs ({in_dims}, rank) and (rank, {out_dims})"
        )
    return rank
