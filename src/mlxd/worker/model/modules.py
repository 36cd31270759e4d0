"""A model's submodules by name, wherever its family nests them (`model.embed_tokens`,
`language_model.model.embed_tokens`, ...): where mlxd puts a wrapper in a module's place."""

from __future__ import annotations

import mlx.nn as nn


def modules_named(model: nn.Module, name: str) -> list[tuple[str, nn.Module]]:
    """Every (dotted key, module) in `model` whose own name is `name`."""
    return [(k, m) for k, m in model.named_modules() if k.split(".")[-1] == name]


def parent_of(model: nn.Module, key: str) -> nn.Module:
    """The module holding the submodule at dotted `key` (list items by index)."""
    parent = model
    for part in key.split(".")[:-1]:
        parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    return parent
