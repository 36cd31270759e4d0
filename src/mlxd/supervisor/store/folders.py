"""Model folders under $MLXD_HOME/models as a pull, copy, create or delete changes them.

New folders are built in `models/.downloads/` (discovery skips dot-folders, so nothing
half-made is ever listed) and moved into place in one rename; copies are hard links where the
file system allows. Free space is checked before a download starts (`check_room`), and one
process at a time works on a model (`exclusive`, a lock file that mlxctl and the daemon share).
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mlxd.shared.errors import BadRequest, Conflict, MlxdError, PayloadTooLarge, Unavailable
from mlxd.shared.sizes import format_size
from mlxd.supervisor.store.names import id_parts

WORK_DIR = ".downloads"
HEADROOM_BYTES = 16 << 20  # left free after a download: a disk filled to the byte fails others


def work_dir(models_dir: Path) -> Path:
    return models_dir / WORK_DIR


def free_bytes(path: Path) -> int:
    """Free bytes on the file system holding `path` (or its nearest existing parent)."""
    for p in (path, *path.parents):
        if p.exists():
            return shutil.disk_usage(p).free
    return 0


def write_error(exc: OSError, what: str) -> MlxdError:
    """A failed write in the models folder, in one line without its path (disk full: 413)."""
    if exc.errno == errno.ENOSPC:
        return PayloadTooLarge(f"cannot write {what}: no space left on the disk")
    return Unavailable(f"cannot write {what}: {exc.strerror or type(exc).__name__}")


def check_room(what: str, need_bytes: int, free: int) -> None:
    """A 413 naming both sizes when `need_bytes` (plus the headroom) do not fit in `free`."""
    if need_bytes + HEADROOM_BYTES > free:
        raise PayloadTooLarge(
            f"not enough disk space for {what}: it needs {format_size(need_bytes)} more, "
            f"{format_size(free)} is free where mlxd keeps models"
        )


@contextmanager
def exclusive(models_dir: Path, key: str, what: str) -> Iterator[None]:
    """Hold `key`'s lock (models/.downloads/<key>.lock) or raise 409: one pull per model,
    whether the daemon or `mlxctl pull` runs it."""
    folder = work_dir(models_dir)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f"{key}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Conflict(f"{what} is already under way (in this daemon or mlxctl)") from None
        try:
            yield
        finally:  # still held: a pull starting now opens a new lock file
            (folder / f"{key}.lock").unlink(missing_ok=True)
            _rmdir_if_empty(folder)
    finally:
        os.close(fd)


def _rmdir_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass  # other work under way, or a partial download kept for resuming


def scratch(models_dir: Path, key: str, what: str) -> Path:
    """A new, empty folder under models/.downloads/ for building a model."""
    path = work_dir(models_dir) / f"{key}.{what}-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    return path


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def _visible(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if not p.name.startswith(".")]
    except OSError:
        return []


def _holds_other_models(path: Path) -> bool:
    """A folder that is not a model yet holds something (an <org>/ folder of models)."""
    return path.is_dir() and not _is_model_dir(path) and bool(_visible(path))


def check_destination(models_dir: Path, model_id: str) -> None:
    """A 400 when model `model_id`'s folder would take the place of, or go inside, something
    that is not that model: an <org>/ folder of other models, a model's own folder ("a/b"
    inside model "a"), or a folder whose name differs only in case (one folder on macOS)."""
    here = models_dir
    parts = id_parts(model_id)
    for i, part in enumerate(parts):
        for other in _visible(here):
            if other.name != part and other.name.lower() == part.lower():
                taken = "/".join([*parts[:i], other.name])
                raise BadRequest(
                    f"'{model_id}' differs only in case from '{taken}' (one folder where "
                    "file names ignore case): pick another name",
                    param="model",
                )
        here = here / part
        if i < len(parts) - 1 and _is_model_dir(here):
            raise BadRequest(
                f"'{'/'.join(parts[: i + 1])}' is a model: '{model_id}' cannot go inside its "
                "folder",
                param="model",
            )
    if _holds_other_models(here):
        raise BadRequest(
            f"'{model_id}' is a folder of other models (or of files that are not a model) in "
            "mlxd's models folder: pick another name",
            param="model",
        )


def place(built: Path, dest: Path) -> None:
    """Move a finished folder into place in one rename, replacing what was there (only a
    model folder: never an <org>/ folder of models)."""
    if not dest.is_symlink() and _holds_other_models(dest):
        raise BadRequest(f"'{dest.name}' is a folder of other models, not a model", param="model")
    dest.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if dest.exists() or dest.is_symlink():
        old = dest.parent / f".trash-{uuid.uuid4().hex[:8]}"
        dest.rename(old)
    built.rename(dest)
    if old is not None:
        _remove(old)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(os.path.realpath(src), dst)  # the HF cache's files are symlinks to blobs
    except OSError:
        shutil.copy2(src, dst)


def copy_model_files(src: Path, dst: Path) -> None:
    """A model folder's files into `dst` (hard links where possible; dot-files left out)."""
    shutil.copytree(
        src,
        dst,
        ignore=lambda _d, names: [n for n in names if n.startswith(".")],
        copy_function=_link_or_copy,
        dirs_exist_ok=True,
    )


def _remove(path: Path) -> None:
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def remove_model_folder(models_dir: Path, path: Path) -> None:
    """Delete a model folder under models_dir (a symlinked one loses only the link), and its
    <org>/ folder once empty."""
    _remove(path)
    parent = path.parent
    if parent != models_dir and parent.parent == models_dir and not any(parent.iterdir()):
        parent.rmdir()


def discard(path: Path) -> bool:
    """Remove a work folder (a partial download, a failed build); whether there was one."""
    if not path.exists():
        return False
    shutil.rmtree(path, ignore_errors=True)
    if path.parent.name == WORK_DIR:
        _rmdir_if_empty(path.parent)
    return True
