"""LoRA adapters made by mlx-lm's own LoRA layers and saved in its format
(adapters.safetensors + adapter_config.json), with random non-zero B: mlx-lm initialises B to
zero, and an adapter that adds nothing would make every comparison pass.

The tests make them for the tiny model (`make_adapter`); the bench (bench/adapters.py) makes
many for a large random-weight shape with `lora_model` and `save_random_adapter`."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.tuner.utils import linear_to_lora_layers, load_adapters

from mlxd.worker.model.load import load_model

# name -> (rank, scale, last layers adapted, keys, seed)
SHAPES = {
    "qv": (4, 8.0, 2, ["self_attn.q_proj", "self_attn.v_proj"], 1),
    "mlp": (8, 4.0, 1, ["mlp.gate_proj", "mlp.down_proj"], 2),
    "all": (2, 16.0, 2, None, 3),
}


def lora_params(rank: int, scale: float, keys: list[str] | None) -> dict:
    """mlx-lm's `lora_parameters` (keys None: mlx-lm's default, every linear layer)."""
    params: dict = {"rank": rank, "scale": scale, "dropout": 0.0}
    if keys is not None:
        params["keys"] = keys
    return params


def lora_model(model, layers: int, params: dict):
    """`model` with mlx-lm's LoRA layers on its last `layers` blocks (in place)."""
    linear_to_lora_layers(model, layers, params)
    return model


def save_random_adapter(model, out: Path, layers: int, params: dict, seed: int) -> Path:
    """Random A and B for every LoRA layer of `model` (lora_model's), saved at `out`."""
    key = mx.random.key(seed)
    factors = {}
    for path, value in tree_flatten(model.parameters()):
        if path.endswith((".lora_a", ".lora_b")):
            key, sub = mx.random.split(key)
            factors[path] = mx.random.normal(value.shape, key=sub) * 0.05
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), factors)
    config = {"fine_tune_type": "lora", "num_layers": layers, "lora_parameters": params}
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


def make_adapter(model_dir: Path, dest: Path, name: str) -> Path:
    """Adapter `name` (SHAPES) for the model at `model_dir`, written under `dest`."""
    rank, scale, layers, keys, seed = SHAPES[name]
    params = lora_params(rank, scale, keys)
    model = lora_model(load_model(model_dir, "tiny").model, layers, params)
    return save_random_adapter(model, dest / name, layers, params, seed)


def mlx_lm_model(model_dir: Path, adapter: Path | None):
    """The model as mlx-lm runs it with `adapter` alone (the oracle)."""
    model = load_model(model_dir, "tiny").model
    if adapter is not None:
        load_adapters(model, str(adapter))
    return model
