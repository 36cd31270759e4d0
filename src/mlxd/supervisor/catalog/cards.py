"""Model cards: what /v1/models tells of each model, read from its folder (never through MLX).

A card is the catalog entry's facts (shared/model_facts.py: kind, context length, features,
quantization) with the model's settings applied (a configured `type`, a `context_limit`) and
its size on disk. Facts are cached per folder and refreshed when its config.json changes, so
listing models and routing a request stay cheap.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from mlxd.shared.config import Settings
from mlxd.shared.errors import BadRequest
from mlxd.shared.model_facts import ModelFacts, ModelType, kind_refusal, read_model_facts
from mlxd.shared.routes import kind_of
from mlxd.supervisor.catalog.discovery import ModelEntry


def _config_stamp(path: Path) -> int:
    try:
        return (path / "config.json").stat().st_mtime_ns
    except OSError:
        return 0


@lru_cache(maxsize=512)
def _cached_facts(path: Path, name: str, override: str | None, stamp: int) -> ModelFacts:
    return read_model_facts(path, name, override)  # type: ignore[arg-type]


def facts_of(entry: ModelEntry, settings: Settings) -> ModelFacts:
    """`entry`'s facts, with its configured `type` (if any) applied."""
    ms = settings.models.get(entry.id)
    override = ms.type if ms is not None else None
    return _cached_facts(entry.path, entry.id, override, _config_stamp(entry.path))


def context_length(facts: ModelFacts, settings: Settings, model_id: str) -> int | None:
    """The context a worker will serve: the model's own, within its `context_limit`."""
    limit = settings.for_model(model_id).context_limit
    native = facts.context_length
    if native and limit:
        return min(native, limit)
    return native or limit


def card_fields(entry: ModelEntry, settings: Settings) -> dict[str, Any]:
    """The card fields a folder gives (ModelCard's optional fields; docs/api.md)."""
    facts = facts_of(entry, settings)
    fields: dict[str, Any] = {
        "type": facts.type,
        "context_length": context_length(facts, settings, entry.id),
        "capabilities": facts.capabilities,
        "architecture": facts.architecture,
        "quantization": facts.quantization,
        "dtype": facts.dtype,
        "size_bytes": entry.weights_bytes,
    }
    if facts.type == "embedding":
        fields["embedding_dimensions"] = facts.hidden_size
        fields["pooling"] = facts.pooling
    return fields


def check_route(entry: ModelEntry, settings: Settings, path: str) -> None:
    """A 400 before any lease or load when `entry`'s kind does not serve `path`."""
    wants: ModelType = kind_of(path)
    why = kind_refusal(facts_of(entry, settings), entry.id, wants)
    if why is not None:
        raise BadRequest(why, param="model", code="model_type_mismatch")
