"""Which models exist: discovered folders, the default model, and imports still under way.

Every id a request names is looked up here (never turned into a path). A model that runs keeps
the entry it was started with while its folder is there, so a request does not rescan disks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mlxd.shared.adapters import split_adapter
from mlxd.shared.config import Settings
from mlxd.shared.errors import BadRequest, ModelNotFound
from mlxd.shared.folder_settings import read_folder_settings, section_over_folder
from mlxd.shared.wire.ollama import LATEST
from mlxd.supervisor.catalog.discovery import ModelEntry, discover, scan_home


class Catalog:
    """Model lookups. `in_use(id)` is the entry a running model was started with, if any."""

    def __init__(
        self,
        settings: Settings,
        in_use: Callable[[str], ModelEntry | None] = lambda model_id: None,
    ):
        self.settings = settings
        self.in_use = in_use
        self.pending: dict[str, asyncio.Task] = {}  # models being imported
        self.configured = dict(settings.models)  # the config file's own sections

    def apply_folder_settings(self, model_id: str | None = None) -> None:
        """Each home model's mlxd.json (shared/folder_settings.py) under its config section,
        into the settings (`model_id`: that model's only; its folder may be gone)."""
        home = {e.id: e for e in scan_home(self.settings.models_dir)}
        for mid in [model_id] if model_id is not None else list(home):
            folder = read_folder_settings(home[mid].path) if mid in home else None
            if folder is not None:
                self.settings.models[mid] = section_over_folder(self.configured.get(mid), folder)
            elif mid in self.configured:
                self.settings.models[mid] = self.configured[mid]
            else:
                self.settings.models.pop(mid, None)

    def entries(self) -> dict[str, ModelEntry]:
        """Every servable model by id, as discovery finds it now."""
        return discover(self.settings)

    def known_names(self) -> list[str]:
        """Every id and alias a request may name: what a "did you mean" picks from."""
        return [*self.entries(), *self.settings.alias_map()]

    def default_model(self) -> str | None:
        """The model a request without `model` gets (None: it must name one)."""
        if self.settings.default_model:
            return self.settings.default_model
        return next((mid for mid, ms in self.settings.models.items() if ms.default), None)

    async def settle(self, model: str | None) -> None:
        """Wait for a model that is still being imported (the built-in one on first start)."""
        name = model or self.default_model() or ""
        task = self.pending.get(self.settings.alias_map().get(name, name))
        if task is not None:
            await asyncio.shield(task)

    def resolve(self, model: str | None) -> ModelEntry:
        """The entry a request's `model` names (or the default one)."""
        if not model:
            model = self.default_model()
            if not model:
                raise BadRequest(
                    "The request has no 'model' and no default model is configured", param="model"
                )
        aliases = self.settings.alias_map()
        model = aliases.get(model, model)  # an alias names its model's id
        entry = self._find(model)
        if entry is None and model.endswith(LATEST):  # Ollama's name of it, as /api/tags lists
            bare = model.removesuffix(LATEST)
            entry = self._find(aliases.get(bare, bare))
        if entry is None:
            raise ModelNotFound(model, self.known_names())
        return entry

    def _find(self, model_id: str) -> ModelEntry | None:
        """The entry of `model_id` (an id, not an alias), or None."""
        entry = self.in_use(model_id)
        if entry is not None and entry.path.exists():
            return entry
        return self.entries().get(model_id)

    def route(self, model: str | None, adapter: object = None) -> tuple[ModelEntry, str | None]:
        """The entry whose worker serves `model`, and the LoRA adapter it names (None: the
        base model): a configured id with `base` and `adapter_path`, "<base>:<adapter>"
        (an id or alias that contains the colon wins), or an `adapter` field."""
        if adapter is not None and (not isinstance(adapter, str) or not adapter):
            raise BadRequest("Invalid 'adapter': must be a non-empty string", param="adapter")
        name = self.settings.alias_map().get(model or "", model)
        section = self.settings.models.get(name or "")
        if section is not None and section.base is not None:
            assert name is not None  # a section's id
            return self.resolve(section.base), adapter or name
        split = split_adapter(model or "")
        if split is None:
            return self.resolve(model), adapter
        assert name is not None  # `model` is "<base>:<adapter>"
        entry = self._find(name)  # an id with the colon first (a miss builds no "did you mean")
        if entry is not None:
            return entry, adapter
        base, named = split
        try:
            return self.resolve(base), adapter or named
        except ModelNotFound:
            raise ModelNotFound(model or "", self.known_names()) from None
