"""One pull, start to end, in the calling thread: the daemon runs it in a thread per pull
(store/pulls.py), `mlxctl pull` runs it in its own process when no daemon answers.

A Hugging Face repository's model files (top-level config, weights and tokenizer files) are
downloaded into `models/.downloads/<id>/` as `<file>.part`, each going on from the bytes an
interrupted pull left; free disk space is checked first; every file is verified (LFS sha256,
else the git blob id) before it takes its name; the folder then moves into place in one rename.
A folder already at the repository's commit is left as it is.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mlxd.shared.errors import BadGateway, BadRequest
from mlxd.shared.sizes import format_size
from mlxd.shared.wire.ollama_manage import ProgressLine
from mlxd.supervisor.store import folders, progress
from mlxd.supervisor.store.hub import Cancelled, Hub, Manifest, RemoteFile
from mlxd.supervisor.store.names import PullTarget, id_parts

# What an mlx-lm folder needs: config and weights (json, safetensors) and the tokenizer.
ALLOW_PATTERNS = (
    "*.json",
    "*.safetensors",
    "tokenizer*",
    "*.model",
    "*.tiktoken",
    "*.txt",
    "*.jinja",
)
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,200}")
STATE = ".mlxd-pull.json"  # the repository and commit a folder holds (staging and final)
PART = ".part"


def model_files(manifest: Manifest) -> list[RemoteFile]:
    """The files of the repository a model folder needs (never a path: top-level names only);
    a 400 when it is not an MLX model folder."""
    files = [
        f
        for f in manifest.files
        if SAFE_NAME.fullmatch(f.name)
        and not f.name.endswith(PART)
        and any(fnmatch.fnmatch(f.name, p) for p in ALLOW_PATTERNS)
    ]
    if not any(f.name == "config.json" for f in files):
        raise BadRequest(
            f"'{manifest.repo}' has no config.json: it is not an MLX model folder (a GGUF "
            "repository? download its .gguf file and use /api/create or mlxctl import-gguf)",
            param="model",
        )
    if not any(f.name.endswith(".safetensors") for f in files):
        raise BadRequest(
            f"'{manifest.repo}' has no .safetensors weights: mlxd serves models in MLX's "
            "safetensors format (a PyTorch .bin repository? convert it with mlx_lm.convert)",
            param="model",
        )
    return files


def readable_safetensors(path: Path) -> bool:
    """Whether `path` starts as a safetensors file does: an 8-byte little-endian header
    length within the file, then that many bytes of a JSON object."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or n > min(size - 8, 100 * 1024**2):
                return False
            header = json.loads(f.read(n))
    except (OSError, ValueError):
        return False
    return isinstance(header, dict)


class Outstanding:
    """The bytes each running pull of this process still has to fetch: a disk check counts
    the others' too, so pulls that each fit alone cannot fill the disk together."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._left: dict[str, int] = {}

    @contextmanager
    def reserve(self, key: str, what: str, need: int, free: int) -> Iterator[Callable[[int], None]]:
        """Check `need` bytes against `free` less the other pulls' outstanding bytes, and
        hold them until the block ends; yields `fetched(n)`, to count bytes as they land."""
        with self._lock:
            others = sum(v for k, v in self._left.items() if k != key)
            if others:
                what = f"{what} (other pulls still need {format_size(others)})"
            folders.check_room(what, need + others, free)
            self._left[key] = need

        def fetched(n: int) -> None:
            with self._lock:
                if key in self._left:
                    self._left[key] = max(0, self._left[key] - n)

        try:
            yield fetched
        finally:
            with self._lock:
                self._left.pop(key, None)


OUTSTANDING = Outstanding()


def _read_state(folder: Path) -> dict:
    try:
        data = json.loads((folder / STATE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_state(folder: Path, manifest: Manifest) -> None:
    (folder / STATE).write_text(json.dumps({"repo": manifest.repo, "commit": manifest.commit}))


def is_current(folder: Path, manifest: Manifest, files: list[RemoteFile]) -> bool:
    """Whether `folder` already holds this commit's files."""
    state = _read_state(folder)
    return state.get("commit") == manifest.commit and all(
        (folder / f.name).is_file() and (folder / f.name).stat().st_size == f.size for f in files
    )


def verify(path: Path, file: RemoteFile) -> bool:
    """Whether the bytes at `path` are `file`: its size, then its LFS sha256 or git blob id."""
    if path.stat().st_size != file.size:
        return False
    if file.sha256:
        digest, expected = hashlib.sha256(), file.sha256
    elif file.blob_id:
        digest, expected = hashlib.sha1(b"blob %d\0" % file.size), file.blob_id
    else:
        return True  # nothing to compare with but the size
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest() == expected


def remaining_bytes(staging: Path, files: list[RemoteFile]) -> int:
    """What is still to download: each file's size less what the staging folder holds."""
    total = 0
    for f in files:
        if (staging / f.name).exists():
            continue
        part = staging / (f.name + PART)
        total += max(0, f.size - (part.stat().st_size if part.exists() else 0))
    return total


def pull(
    target: PullTarget,
    models_dir: Path,
    hub: Hub,
    *,
    emit: Callable[[ProgressLine], None],
    cancelled: Callable[[], bool] = lambda: False,
    on_ready: Callable[[], None] = lambda: None,
    free_bytes: Callable[[Path], int] = folders.free_bytes,
    clock: Callable[[], float] = time.monotonic,
    outstanding: Outstanding = OUTSTANDING,
) -> Path:
    """Download `target` into models_dir; returns its folder. `on_ready` is called once the
    file list is known and the disk has room (failures before it are the request's, after it
    the stream's); `cancelled()` is asked as bytes arrive and raises Cancelled when true."""
    folders.check_destination(models_dir, target.model_id)
    emit(progress.line(progress.MANIFEST))
    manifest = hub.manifest(target.repo, target.revision)
    files = model_files(manifest)
    dest = models_dir.joinpath(*id_parts(target.model_id))
    if is_current(dest, manifest, files):
        on_ready()
        emit(progress.line(progress.SUCCESS))
        return dest
    with folders.exclusive(models_dir, target.key, f"a download of '{target.model_id}'"):
        staging = folders.work_dir(models_dir) / target.key
        if _read_state(staging).get("commit") not in (None, manifest.commit):
            folders.discard(staging)  # parts of another commit: start this one afresh
        what = f"'{target.model_id}'"
        need = remaining_bytes(staging, files)
        free = free_bytes(staging)
        with outstanding.reserve(target.key, what, need, free) as fetched:
            staging.mkdir(parents=True, exist_ok=True)
            _write_state(staging, manifest)
            on_ready()
            throttle = progress.Throttle(clock)
            for f in files:
                _fetch(hub, manifest, f, staging, emit, cancelled, throttle, fetched)
        emit(progress.line(progress.VERIFYING))
        for f in files:
            part = staging / (f.name + PART)
            if part.exists():
                if not verify(part, f):
                    part.unlink()
                    raise BadGateway(
                        f"{f.name} of {target.repo} does not match its checksum: the download "
                        "was damaged (pull again to download that file anew)"
                    )
                part.rename(staging / f.name)
            if f.name.endswith(".safetensors") and not readable_safetensors(staging / f.name):
                raise BadRequest(
                    f"{f.name} of {target.repo} is not a readable safetensors file (its "
                    "header is damaged, though it matches the hub's checksum): the "
                    "repository cannot be served",
                    param="model",
                )
        emit(progress.line(progress.WRITING))
        for leftover in staging.glob(f"*{PART}"):  # files the repository no longer has
            leftover.unlink()
        shutil.rmtree(staging / ".cache", ignore_errors=True)
        folders.place(staging, dest)
    emit(progress.line(progress.SUCCESS))
    return dest


def _fetch(hub, manifest, f, staging, emit, cancelled, throttle, fetched) -> None:
    """One file into `<name>.part`, its progress emitted as the bytes come."""
    if (staging / f.name).exists():
        emit(progress.file_line(f, f.size))
        return
    part = staging / (f.name + PART)
    done = part.stat().st_size if part.exists() else 0
    emit(progress.file_line(f, done))
    if done >= f.size:
        return

    def on_bytes(n: int) -> None:
        nonlocal done
        if cancelled():
            raise Cancelled(f"the pull of {manifest.repo} was cancelled")
        done += n
        fetched(n)
        if done > f.size:  # never more than the disk check counted: the listing is the bound
            raise BadGateway(
                f"{f.name} of {manifest.repo} is larger than the hub's listing says "
                f"({f.size} bytes): the download stopped"
            )
        if throttle.due(f.name, done >= f.size):
            emit(progress.file_line(f, done))

    if cancelled():
        raise Cancelled(f"the pull of {manifest.repo} was cancelled")
    hub.fetch(manifest.repo, manifest.commit, f, part, on_bytes)
