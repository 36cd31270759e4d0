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

from mlxd.shared.errors import Conflict, MlxdError, PayloadTooLarge, Unavailable
from mlxd.shared.sizes import format_size

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


def place(built: Path, dest: Path) -> None:
    """Move a finished folder into place in one rename, replacing what was there."""
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
