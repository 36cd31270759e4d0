"""The SSD tier's bytes on disk: one safetensors file and one JSON sidecar per entry.

`<key>.safetensors` holds each cache layer's tensors, named by kind (kinds.py: `<layer>.k` and
`<layer>.v` for attention KV, a window's `.rot`, a recurrent state's `.a<j>`; bfloat16 stored
as uint16) and the token ids (`__tokens__`); `<key>.json` holds the namespace, token ids, byte
size, digest (digest.py: a SHA-256 over its 4 MiB pieces' SHA-256s, `piece_bytes`; a sidecar
without it, an older one, the whole file's SHA-256), session and format version. A read
into one buffer checks the digest before it parses anything, then takes the tensors as views
of the bytes it read (no copy); a read into a buffer per tensor (restore_read.py) parses the
bounded header first, checked to tile the file, and checks the digest before any tensor is
used. The key is a hash of namespace and token ids, so a renamed file does not index.
Both files are written atomically (a temporary file, fsync, rename, fsync of the folder).
Everything a format change touches is here and in safetensors_file.py (the data file's
layout); FORMAT_VERSION is also part of the folder's fingerprint (layout.py), so entries of
another version are never even listed.
Pure NumPy and file I/O: safe off the engine thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from mlxd.worker.cache.digest import MAX_PIECES, PIECE_BYTES, parts_digest
from mlxd.worker.cache.kinds import LayoutMismatch, check_layer
from mlxd.worker.cache.replies import Reply
from mlxd.worker.cache.safetensors_file import safetensors_parts, tensor_views

FORMAT_VERSION = 1
DATA_SUFFIX = ".safetensors"
META_SUFFIX = ".json"
TMP_SUFFIX = ".tmp"  # `<file>.<pid>.tmp`: a write in progress, or one a crash left behind
TOKENS_TENSOR = "__tokens__"
# One tuple per cache layer, by kind (kinds.py; kv_arrays.kv_layout makes it).
Layout = tuple[tuple, ...]


@dataclass(eq=False)
class SsdEntry:
    """One entry as the index knows it (from its sidecar and its data file's size)."""

    key: str
    ns: str
    tokens: tuple[int, ...]
    file_bytes: int
    sha256: str
    session: str | None
    last_used: float
    replies: tuple[Reply, ...] = ()  # the generated ids among `tokens` (replies.py)
    piece_bytes: int = 0  # how `sha256` hashes the file (digest.py); 0: the plain SHA-256


def entry_key(ns: str, tokens: tuple[int, ...]) -> str:
    """The file name of the entry for (namespace, token ids)."""
    h = hashlib.sha256(ns.encode() + b"\0" + np.asarray(tokens, dtype=np.uint32).tobytes())
    return h.hexdigest()[:32]


def data_path(folder: Path, key: str) -> Path:
    return folder / (key + DATA_SUFFIX)


def meta_path(folder: Path, key: str) -> Path:
    return folder / (key + META_SUFFIX)


def entry_paths(folder: Path, key: str) -> tuple[Path, Path]:
    """An entry's files, data first (the order to delete them in)."""
    return data_path(folder, key), meta_path(folder, key)


# -- the tensors ------------------------------------------------------------------------------
def check_layout(arrays: dict[str, np.ndarray], layout: Layout, n_tokens: int) -> None:
    """Raise LayoutMismatch unless `arrays` are exactly this model's caches for `n_tokens`."""
    counted = sum(check_layer(i, layer, arrays, n_tokens) for i, layer in enumerate(layout))
    if len(arrays) != counted:
        raise LayoutMismatch(f"{len(arrays)} arrays for a model of {len(layout)} layers")


# -- an entry's two files ---------------------------------------------------------------------
def encode_entry(
    ns: str,
    tokens: tuple[int, ...],
    arrays: dict[str, np.ndarray],
    meta: dict[str, str],
    session: str | None,
    replies: tuple[Reply, ...] = (),
) -> tuple[list, bytes, int, str]:
    """An entry as (data file parts, sidecar bytes, data bytes, SHA-256 of the data)."""
    tensors = {**arrays, TOKENS_TENSOR: np.asarray(tokens, dtype=np.uint32)}
    parts = safetensors_parts(tensors, {**meta, "format": str(FORMAT_VERSION)})
    size = sum(len(p) for p in parts)
    digest = parts_digest(parts, PIECE_BYTES)
    info = {
        "ns": ns,
        "tokens": list(tokens),
        "file_bytes": size,
        "sha256": digest,
        "piece_bytes": PIECE_BYTES,
        "session": session,
        "format": FORMAT_VERSION,
    }
    if replies:  # optional: a sidecar without it (an older one) is an entry without replies
        info["replies"] = [[r.at, list(r.ids)] for r in replies]
    return parts, orjson.dumps(info), size, digest


def decode_entry(
    data: np.ndarray, digest: str, e: SsdEntry, layout: Layout | None
) -> dict[str, np.ndarray]:
    """The arrays of `e`'s data file (`data`, whose digest.py digest is `digest`) after
    checking size, digest, token ids and, given the model's layout, shapes and dtype; views of
    `data`, no copies. Raises (LayoutMismatch for a model mismatch) otherwise."""
    check_file(len(data), digest, e)
    return check_entry(tensor_views(data), e, layout)


def check_file(size: int, digest: str, e: SsdEntry) -> None:
    """ValueError unless a data file read for `e` has the size and digest its sidecar says."""
    if size != e.file_bytes or digest != e.sha256:
        raise ValueError("size or hash mismatch")


def check_entry(
    arrays: dict[str, np.ndarray], e: SsdEntry, layout: Layout | None
) -> dict[str, np.ndarray]:
    """`arrays` (an entry's tensors, its file's size and digest already checked) less the
    token ids, after checking those and, given the model's layout, shapes and dtypes."""
    if tuple(arrays.pop(TOKENS_TENSOR).tolist()) != e.tokens:
        raise ValueError("token ids mismatch")
    if layout is not None:
        check_layout(arrays, layout, len(e.tokens))
    return arrays


def entry_from_meta(key: str, meta, data_bytes: int, mtime: float) -> SsdEntry:
    """An index entry from a metadata file's content; ValueError when it does not add up."""
    if not isinstance(meta, dict) or not isinstance(meta.get("ns"), str):
        raise ValueError("not an entry")
    tokens = meta.get("tokens")
    if not isinstance(tokens, list) or not all(type(t) is int and 0 <= t < 2**32 for t in tokens):
        raise ValueError("bad token ids")
    tokens = tuple(tokens)
    if data_bytes != meta.get("file_bytes") or not isinstance(meta.get("sha256"), str):
        raise ValueError("size mismatch")
    if entry_key(meta["ns"], tokens) != key:
        raise ValueError("name does not match its tokens")
    piece_bytes = meta.get("piece_bytes", 0)  # absent: an older sidecar, a plain SHA-256
    if type(piece_bytes) is not int or piece_bytes < 0:
        raise ValueError("bad piece size")
    if piece_bytes and data_bytes > piece_bytes * MAX_PIECES:  # a read would queue them all
        raise ValueError("too many pieces")
    session = meta.get("session")
    return SsdEntry(
        key,
        meta["ns"],
        tokens,
        data_bytes,
        meta["sha256"],
        session if isinstance(session, str) else None,
        mtime,
        _replies(meta.get("replies"), len(tokens)),
        piece_bytes,
    )


def _replies(raw, n_tokens: int) -> tuple[Reply, ...]:
    """The sidecar's replies; none when they do not add up (the entry itself stays)."""
    if not isinstance(raw, list):
        return ()
    out = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2 and type(item[0]) is int):
            return ()
        at, ids = item
        if not 0 < at < n_tokens or not isinstance(ids, list):
            return ()
        if not all(type(t) is int and 0 <= t < 2**32 for t in ids):
            return ()
        out.append(Reply(at, tuple(ids)))
    return tuple(out)


def read_entry(folder: Path, key: str) -> SsdEntry:
    """The index entry of `key` from its sidecar and its data file's size and time.

    Raises FileNotFoundError or ValueError (orjson's too) for an incomplete or damaged entry,
    another OSError for one that cannot be read."""
    meta = orjson.loads(meta_path(folder, key).read_bytes())
    st = data_path(folder, key).stat()
    return entry_from_meta(key, meta, st.st_size, st.st_mtime)


def write_entry(folder: Path, key: str, parts: list, sidecar: bytes) -> None:
    """Both files of an entry, atomically and durably: data first, so a sidecar never names
    data that is not there."""
    write_atomic(data_path(folder, key), *parts)
    write_atomic(meta_path(folder, key), sidecar)
    fsync_dir(folder)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, *parts) -> None:
    # The pid keeps two workers of one folder (a hot reload) off each other's temporary files.
    tmp = path.with_name(f"{path.name}.{os.getpid()}{TMP_SUFFIX}")
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a half-written file must not hold the disk
            tmp.unlink()
        raise
