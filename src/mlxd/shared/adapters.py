"""How a request names a LoRA adapter, and how the supervisor tells the worker.

A client names one by its model id (`model: "<base>:<adapter>"`, or a configured model id whose
section has `base` and `adapter_path`), or with an `adapter` field beside `model`. The
supervisor resolves that to the base model's worker and passes the adapter's name in
ADAPTER_HEADER (a client's own such header never travels: the proxy sets or drops it).
"""

from __future__ import annotations

import re

from mlxd.shared.errors import BadRequest

ADAPTER_HEADER = "x-mlxd-adapter"
SEPARATOR = ":"
# "latest" is Ollama's default tag ("a:latest" is model "a"), so no adapter may take that name.
ADAPTER_NAME = re.compile(r"^(?!latest$)[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
NAME_RULE = "letters, digits, '.', '_' and '-', at most 64, and not 'latest'"


def check_name(name: str, param: str = "adapter") -> str:
    """`name`, or a 400 (on `param`) when it is no name an adapter may take."""
    if not ADAPTER_NAME.match(name):
        raise BadRequest(f"Invalid adapter name {name[:80]!r}: {NAME_RULE}", param=param)
    return name


def split_adapter(model: str) -> tuple[str, str] | None:
    """("base", "adapter") for "base:adapter" (the last colon), else None ("a:latest" is
    Ollama's name for model "a", never an adapter)."""
    base, sep, adapter = model.rpartition(SEPARATOR)
    if not sep or not base or not adapter or adapter == "latest":
        return None
    return base, adapter


def adapter_model_id(base: str, adapter: str) -> str:
    """The model id that names `adapter` on `base` (what /v1/models lists)."""
    return f"{base}{SEPARATOR}{adapter}"
