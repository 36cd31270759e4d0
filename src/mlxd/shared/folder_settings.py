"""A model folder's own request defaults: `mlxd.json` beside its config.json.

Ollama's /api/create writes it (a Modelfile's PARAMETER, SYSTEM and TEMPLATE) and /api/copy
carries it over; the supervisor reads it into the model's settings at start and after each of
those, under the config file's `[models."<id>"]` section: a key the section sets wins.
The keys are a subset of that section's (shared/config.py), with the same bounds. Pure: no MLX.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import ConfigDict, Field, ValidationError

from mlxd.shared.config import ModelSettings, is_template_text
from mlxd.shared.sampling import SamplingFields

FILE_NAME = "mlxd.json"


class FolderSettings(SamplingFields):
    """What a model folder may set of its own section: sampling, max_tokens, context_limit,
    the system prompt and a chat template (Jinja text)."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int | None = Field(None, ge=1)
    context_limit: int | None = Field(None, ge=16)
    system: str | None = None
    chat_template: str | None = None

    def values(self) -> dict:
        """The keys that are set."""
        return self.model_dump(exclude_none=True)


def read_folder_settings(folder: Path) -> FolderSettings | None:
    """The folder's mlxd.json (None when it has none, or one that is not valid)."""
    try:
        data = json.loads((folder / FILE_NAME).read_text())
        return FolderSettings.model_validate(data)
    except (OSError, ValueError, ValidationError):
        return None


def write_folder_settings(folder: Path, settings: FolderSettings) -> None:
    """Write mlxd.json (a new file, renamed over the old: a hard-linked copy keeps its own)."""
    path = folder / FILE_NAME
    values = settings.values()
    if not values:
        path.unlink(missing_ok=True)
        return
    tmp = folder / f".{FILE_NAME}.tmp"
    tmp.write_text(json.dumps(values, indent=2) + "\n")
    os.replace(tmp, path)


def section_over_folder(section: ModelSettings | None, folder: FolderSettings) -> ModelSettings:
    """The model's settings: the folder's values under the config section's own."""
    own = section.model_dump(exclude_unset=True) if section is not None else {}
    return ModelSettings(**{**folder.values(), **own})


def folder_settings_of(section: ModelSettings | None) -> FolderSettings:
    """The part of a config section a folder can carry (a template file read as its text)."""
    if section is None:
        return FolderSettings()
    values = {k: getattr(section, k) for k in FolderSettings.model_fields}
    template = values.get("chat_template")
    if template is not None and not is_template_text(template):
        try:
            values["chat_template"] = Path(template).read_text()
        except OSError:
            values["chat_template"] = None
    return FolderSettings(**values)
