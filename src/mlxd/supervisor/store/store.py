"""Model files on this machine as Ollama's API manages them: pull, delete, copy, create
(docs/api.md, "Managing models"). One operation per model id at a time (409 otherwise).

- delete: only models under $MLXD_HOME/models (never the Hugging Face cache or a configured
  path); a loaded model is unloaded first (its requests finish), then its folder goes.
- copy and create build the new folder in models/.downloads/ (hard links to the source's
  files; a GGUF through the importer in a child process) with the new model's settings in its
  mlxd.json, then move it into place, replacing a model of that name as Ollama does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mlxd.shared.errors import BadRequest, Conflict
from mlxd.shared.folder_settings import (
    FolderSettings,
    folder_settings_of,
    read_folder_settings,
    write_folder_settings,
)
from mlxd.shared.wire.ollama_manage import ProgressLine
from mlxd.supervisor.catalog.discovery import ModelEntry
from mlxd.supervisor.catalog.gguf_import import run_import
from mlxd.supervisor.registry.operations import ModelOps
from mlxd.supervisor.registry.registry import Registry
from mlxd.supervisor.store import folders
from mlxd.supervisor.store.hub import Hub
from mlxd.supervisor.store.names import PullTarget, id_parts
from mlxd.supervisor.store.progress import SUCCESS, WRITING, line
from mlxd.supervisor.store.pulls import Pulls

Emit = Callable[[ProgressLine], None]
SOURCES = {"hf-cache": "the Hugging Face cache", "config": "a path in config.toml"}


@dataclass(frozen=True)
class Source:
    """What a created model is made from: a known model, a model folder or a GGUF file."""

    kind: str  # "model", "folder" or "gguf"
    path: Path
    settings: FolderSettings  # what it brings (a model's own, a folder's mlxd.json)


class ModelStore:
    """Pulls, deletes, copies and creates over one registry."""

    def __init__(self, reg: Registry, ops: ModelOps, hub: Hub | None = None, **pull_options):
        self.reg = reg
        self.ops = ops
        self.models_dir = reg.settings.models_dir
        self.pulls = Pulls(self.models_dir, hub or Hub(), on_done=self._changed, **pull_options)
        self.busy: dict[str, str] = {}  # model id → what is being done to it

    def _changed(self, model_id: str) -> None:
        self.reg.catalog.apply_folder_settings(model_id)

    @contextmanager
    def _claim(self, model_id: str, doing: str) -> Iterator[None]:
        under_way = self.busy.get(model_id)
        if under_way is None and model_id in self.pulls.active:
            under_way = "being pulled"
        if under_way is not None:
            raise Conflict(f"'{model_id}' is {under_way}; try again once that is done")
        self.busy[model_id] = doing
        try:
            yield
        finally:
            del self.busy[model_id]

    async def pull(self, target: PullTarget):
        """Start or join `target`'s pull (store/pulls.py): (the pull, a queue of its lines)."""
        if (doing := self.busy.get(target.model_id)) is not None:
            raise Conflict(f"'{target.model_id}' is {doing}; try again once that is done")
        return await self.pulls.follow(target)

    def discard_download(self, target: PullTarget) -> bool:
        """Delete what a cancelled pull of `target` left for resuming; whether there was any
        (409 while `mlxctl pull` downloads it: the lock that one pull per model holds)."""
        doing = f"a download of '{target.model_id}'"
        with self._claim(target.model_id, "being deleted"):
            with folders.exclusive(self.models_dir, target.key, doing):
                return folders.discard(folders.work_dir(self.models_dir) / target.key)

    async def delete(self, entry: ModelEntry) -> bool:
        """Delete a model folder under $MLXD_HOME/models, unloading the model first; True if
        it was loaded."""
        if entry.source != "home":
            raise BadRequest(
                f"'{entry.id}' is in {SOURCES.get(entry.source, entry.source)}: mlxd deletes "
                "only the models in its own models folder",
                param="model",
            )
        with self._claim(entry.id, "being deleted"):

            async def remove() -> None:
                staging = folders.work_dir(self.models_dir) / entry.id.replace("/", "--")
                try:
                    await asyncio.to_thread(
                        folders.remove_model_folder, self.models_dir, entry.path
                    )
                    folders.discard(staging)  # a partial pull of the same name
                except OSError as exc:
                    raise folders.write_error(exc, f"'{entry.id}'") from None

            was_loaded = await self.ops.retire(entry.id, remove)
            self._changed(entry.id)
            return was_loaded

    def check_destination(self, model_id: str) -> None:
        """A name that is already an alias, or a model mlxd does not keep, cannot be replaced;
        nor can a folder that is not that model's (folders.check_destination)."""
        catalog = self.reg.catalog
        if model_id in self.reg.settings.alias_map():
            raise BadRequest(f"'{model_id}' is already an alias of a model", param="model")
        entry = catalog.entries().get(model_id)
        if entry is not None and entry.source != "home":
            where = SOURCES.get(entry.source, entry.source)
            raise BadRequest(f"'{model_id}' already names a model in {where}", param="model")
        folders.check_destination(self.models_dir, model_id)

    def source_of_model(self, entry: ModelEntry) -> Source:
        """A known model as a create's or copy's source: its folder and its own settings."""
        own = folder_settings_of(self.reg.settings.models.get(entry.id))
        return Source("model", entry.path, own)

    async def build(
        self, model_id: str, source: Source, settings: FolderSettings, emit: Emit
    ) -> Path:
        """Make model `model_id` from `source` with `settings` over the source's own, and move
        it into place (replacing a model of that name, unloaded first). Returns its folder."""
        self.check_destination(model_id)
        key = model_id.replace("/", "--")
        with self._claim(model_id, "being created"):
            work = folders.scratch(self.models_dir, key, "create")
            try:
                built = await self._fill(work, source, emit)
                emit(line(WRITING))
                merged = FolderSettings(**{**source.settings.values(), **settings.values()})
                write_folder_settings(built, merged)
                dest = self.models_dir.joinpath(*id_parts(model_id))

                async def swap() -> None:
                    await asyncio.to_thread(folders.place, built, dest)

                await self.ops.retire(model_id, swap)
            except OSError as exc:
                raise folders.write_error(exc, f"'{model_id}'") from None
            finally:
                folders.discard(work)
            self._changed(model_id)
        emit(line(SUCCESS))
        return dest

    async def _fill(self, work: Path, source: Source, emit: Emit) -> Path:
        if source.kind != "gguf":
            emit(line("copying model files"))
            await asyncio.to_thread(folders.copy_model_files, source.path, work)
            return work
        emit(line(f"importing {source.path.name}"))
        built = work / "model"

        def said(text: str) -> None:
            if text != str(built):  # its last line, the folder: no path goes to the client
                emit(line(text))

        code, tail = await run_import(source.path, work, built.name, said)
        if code != 0:
            reason = next((t for t in reversed(tail) if t.startswith("error: ")), "error: failed")
            reason = reason.removeprefix("error: ").replace(str(work), "").strip()
            raise BadRequest(f"cannot import {source.path.name}: {reason}", param="from")
        return built

    def source_of_path(self, path: Path) -> Source:
        """A path on this machine as a create's source: a GGUF file or a model folder."""
        if path.is_file() and path.suffix.lower() == ".gguf":
            return Source("gguf", path, FolderSettings())
        if path.is_dir() and (path / "config.json").is_file():
            return Source("folder", path, read_folder_settings(path) or FolderSettings())
        raise BadRequest(
            f"'from' {str(path)[:300]} is neither a GGUF file nor a model folder (one with a "
            "config.json) on this machine",
            param="from",
        )

    async def close(self) -> None:
        """The daemon is stopping: pulls stop at their next chunk, their bytes kept."""
        self.pulls.cancel_all()
