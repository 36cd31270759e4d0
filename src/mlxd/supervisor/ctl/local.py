"""mlxctl's commands that touch $MLXD_HOME/models directly: rm, import-gguf (pull: ctl/pull.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from mlxd.supervisor.catalog.discovery import scan_home
from mlxd.supervisor.ctl.client import CtlError
from mlxd.supervisor.store.folders import remove_model_folder


def find_home_model(models_dir: Path, model_id: str) -> Path:
    """The folder of `model_id` among the models discovered in models_dir (nowhere else)."""
    found = {e.id: e.path for e in scan_home(models_dir)}
    path = found.get(model_id)
    if path is None:
        raise CtlError(f"no model '{model_id}' in {models_dir}")
    if path.parent not in (models_dir, models_dir / model_id.split("/")[0]):
        raise CtlError(f"'{model_id}' is not directly under {models_dir}")  # pragma: no cover
    return path


def remove(models_dir: Path, model_id: str) -> Path:
    """Delete a model folder under models_dir (a symlinked folder loses only the link)."""
    path = find_home_model(models_dir, model_id)
    remove_model_folder(models_dir, path)
    return path


def import_gguf_argv(
    file: str, models_dir: Path, model_id: str | None, overwrite: bool = False
) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "mlxd.worker.importers.gguf",
        file,
        "--models-dir",
        str(models_dir),
    ]
    argv += ["--id", model_id] if model_id else []
    return argv + ["--overwrite"] if overwrite else argv


def import_gguf(file: str, models_dir: Path, model_id: str | None, overwrite: bool = False) -> int:
    """Run the importer in its own interpreter (it needs MLX; mlxctl never imports it); it
    shares mlxctl's terminal, so its progress bar and its one error line reach the user."""
    models_dir.mkdir(parents=True, exist_ok=True)
    argv = import_gguf_argv(file, models_dir, model_id, overwrite)
    try:
        return subprocess.run(argv, check=False).returncode
    except KeyboardInterrupt:  # the importer got the Ctrl-C too and cleaned up after itself
        return 130
