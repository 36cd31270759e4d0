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
Everything a format change touches is here; FORMAT_VERSION is also part of the folder's
fingerprint (layout.py), so entries of another version are never even listed.
Pure NumPy and file I/O: safe off the engine thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import orjson

from mlxd.worker.cache.digest import MAX_PIECES, PIECE_BYTES, parts_digest
from mlxd.worker.cache.kinds import LayoutMismatch, check_layer
from mlxd.worker.cache.replies import Reply

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


_ST_DTYPES: dict[str, str] = {
    "float32": "F32",
    "float16": "F16",
    "uint16": "U16",
    "uint32": "U32",
    "int32": "I32",
    "int64": "I64",
    "uint8": "U8",
    "int8": "I8",
}
_NP_DTYPES = {st: name for name, st in _ST_DTYPES.items()}


def safetensors_parts(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> list:
    """A safetensors file as [header, buffer, buffer, ...] without joining the buffers.

    Writing and hashing the parts one by one (both release the GIL on large buffers) keeps the
    writer thread from stalling the engine thread the way building one big bytes object would.
    """
    header: dict = {"__metadata__": metadata}
    parts, offset = [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        header[name] = {
            "dtype": _ST_DTYPES[a.dtype.name],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        parts.append(a.data.cast("B"))  # `data`: the array's memoryview
        offset += a.nbytes
    head = orjson.dumps(header)
    head += b" " * (-len(head) % 8)  # the format aligns the data to 8 bytes
    return [len(head).to_bytes(8, "little") + head, *parts]


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


class TensorSpec(NamedTuple):
    """One tensor of a data file: its bytes are [start, stop) of the file."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int
    stop: int


# An entry's header is ~100 bytes a tensor (a few tensors a layer): 1 MiB is ~10k tensors, far
# above any model's, and bounds what a damaged header can ask of a read before its digest.
MAX_HEADER_BYTES = 1 << 20


def header_length(first8: bytes, size: int) -> int:
    """The header's length from a data file's first 8 bytes; ValueError when it cannot be."""
    n = int.from_bytes(first8, "little")
    if len(first8) < 8 or size < 8 or not 0 < n <= min(size - 8, MAX_HEADER_BYTES):
        raise ValueError("bad header length")
    return n


def parse_header(head: bytes, size: int) -> list[TensorSpec]:
    """The tensors of a `size`-byte data file whose first 8 + n bytes are `head`, in file
    order; ValueError unless they tile the rest of the file exactly (each its dtype's bytes,
    in order, nothing left over)."""
    n = header_length(head[:8], size)
    header = orjson.loads(head[8 : 8 + n])
    if not isinstance(header, dict):
        raise ValueError("bad header")
    header.pop("__metadata__", None)
    base, end, out = 8 + n, 0, []
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        dtype = np.dtype(_NP_DTYPES[t["dtype"]])
        shape = tuple(int(x) for x in t["shape"])
        start, stop = (int(x) for x in t["data_offsets"])
        count = int(np.prod(shape, dtype=np.int64))
        if start != end or stop - start != count * dtype.itemsize:
            raise ValueError(f"tensor {name} does not fit its place in the file")
        out.append(TensorSpec(name, dtype, shape, base + start, base + stop))
        end = stop
    if base + end != size:
        raise ValueError("bytes left over after the tensors")
    return out


def tensor_views(data: np.ndarray) -> dict[str, np.ndarray]:
    """A safetensors file's tensors as views of its bytes (`parse_header`'s checks)."""
    n = header_length(data[:8].tobytes(), len(data))
    specs = parse_header(data[: 8 + n].tobytes(), len(data))
    return {
        t.name: np.frombuffer(
            data, t.dtype, (t.stop - t.start) // t.dtype.itemsize, t.start
        ).reshape(t.shape)
        for t in specs
    }


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
