"""Which LoRA adapters a model mounts, and the model ids requests name them by."""

from __future__ import annotations

from pathlib import Path

from mlxd.shared.adapters import adapter_model_id
from mlxd.shared.errors import NotFound
from mlxd.supervisor.registry.registry import Registry


def adapters_of(reg: Registry, model_id: str) -> dict[str, Path]:
    """The adapters `model_id` mounts: its slot's (runtime mounts too), else its config's."""
    slot = reg.lifecycle.slots.get(model_id)
    return dict(slot.settings.adapters if slot else reg.settings.for_model(model_id).adapters)


def adapter_ids(reg: Registry, model_id: str) -> dict[str, str]:
    """Each adapter's model id (a configured id, else "<model>:<name>") -> its name."""
    out = {}
    for name in adapters_of(reg, model_id):
        section = reg.settings.models.get(name)
        own = section is not None and section.base == model_id
        out[name if own else adapter_model_id(model_id, name)] = name
    return out


def check_mounted(reg: Registry, model_id: str, adapter: str | None, param: str = "model") -> None:
    """A 404 for a request naming an adapter `model_id` does not mount, before its lease: a
    typo'd "model:adapter" must not load the model (evicting others) to be refused, nor
    unload it (Ollama's keep_alive 0)."""
    if adapter is not None and adapter not in adapters_of(reg, model_id):
        named = adapter[:100]  # a client's text, echoed bounded
        raise NotFound(f"No adapter named {named!r} is mounted on {model_id!r}", param=param)
