"""mlxctl's commands that touch $MLXD_HOME/models directly: pull, rm, import-gguf."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from mlxd.supervisor.catalog.discovery import scan_home
from mlxd.supervisor.ctl.client import CtlError

# What an mlx-lm folder needs: config and weights (json, safetensors) and the tokenizer.
ALLOW_PATTERNS = [
    "*.json",
    "*.safetensors",
    "tokenizer*",
    "*.model",
    "*.tiktoken",
    "*.txt",
    "*.jinja",
]
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
REPO_RE = re.compile(rf"^{_PART}(/{_PART})?$")


def _repo_parts(repo: str) -> list[str]:
    if not REPO_RE.match(repo) or ".." in repo:
        raise CtlError(f"'{repo}' is not a Hugging Face repository id (org/name)")
    return repo.split("/")


def pull(repo: str, models_dir: Path, revision: str | None = None, download=None) -> Path:
    """Download `repo` into models_dir/<org>/<name>; returns that folder.

    The download lands in models_dir/.downloads/ (discovery skips dot-folders), then replaces
    the model folder in one rename. A failed or interrupted pull removes what it downloaded.
    """
    parts = _repo_parts(repo)
    if download is None:
        from huggingface_hub import snapshot_download as download
    staging = models_dir / ".downloads" / "--".join(parts)
    staging.mkdir(parents=True, exist_ok=True)
    try:
        _download(download, repo, revision, staging)
    except BaseException:
        _discard(staging)
        raise
    dest = models_dir.joinpath(*parts)
    dest.parent.mkdir(parents=True, exist_ok=True)
    old = models_dir / f".trash-{uuid.uuid4().hex[:8]}"
    if dest.exists():
        dest.rename(old)
    staging.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return dest


def _download(download, repo: str, revision: str | None, staging: Path) -> None:
    try:
        download(
            repo_id=repo, revision=revision, local_dir=str(staging), allow_patterns=ALLOW_PATTERNS
        )
    except Exception as exc:  # offline, unknown repo, gated, network: one readable line
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CtlError(f"cannot download {repo}: {reason}") from None
    if not (staging / "config.json").is_file():
        raise CtlError(f"{repo} has no config.json: not a model folder mlxd can serve")
    shutil.rmtree(staging / ".cache", ignore_errors=True)  # the hub's resume bookkeeping


def _discard(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.parent.rmdir()  # .downloads/ itself, once no other pull is under way
    except OSError:
        pass


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
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path)
    if path.parent != models_dir and not any(path.parent.iterdir()):
        path.parent.rmdir()  # the now empty <org>/ folder
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
