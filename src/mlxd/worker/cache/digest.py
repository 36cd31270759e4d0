"""An SSD entry's digest, and its data file read and hashed in one pass.

The digest is a SHA-256 over the SHA-256s of the data file's 4 MiB pieces, in order
(`PIECE_BYTES`, stored in the sidecar as `piece_bytes`). Pieces are read and hashed on a few
threads (file reads and hashlib both release the GIL), each piece hashed right after it is
read, while its bytes are still in the CPU's cache: a restore of a 1.5 GB entry otherwise
spent about a second in one thread's SHA-256 alone (issue 34). A changed or missing byte
changes its piece's digest and so the digest; the size is checked apart. Sidecars written
before hold a plain SHA-256 of the whole file (`piece_bytes` 0): still verified so.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np

PIECE_BYTES = 4 << 20
MAX_PIECES = 1 << 16  # a sidecar asking for more (tiny pieces of a big file) is damaged
MAX_THREADS = 16  # reading + hashing 1.36 GB on the H100 host: 8 threads 255 ms, 16 146 ms

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            n = max(1, min(MAX_THREADS, os.cpu_count() or 1))
            _pool = ThreadPoolExecutor(n, thread_name_prefix="mlxd-cache-hash")
        return _pool


def _spans(size: int, piece_bytes: int) -> list[tuple[int, int]]:
    return [(a, min(a + piece_bytes, size)) for a in range(0, size, piece_bytes)] or [(0, 0)]


def _combine(pieces: Iterable[Any]) -> str:
    h = hashlib.sha256()
    for d in pieces:
        h.update(d)
    return h.hexdigest()


def parts_digest(parts: list, piece_bytes: int = PIECE_BYTES) -> str:
    """The digest of the file `parts` (bytes-like, in order) make, as the sidecar holds it."""
    views = [memoryview(p).cast("B") for p in parts]
    if piece_bytes <= 0:
        return _combine(views)  # the whole file's plain SHA-256: h.update over every part
    bounds, at = [], 0
    for v in views:
        bounds.append((at, v))
        at += len(v)

    def piece(span: tuple[int, int]) -> bytes:
        a, b = span
        h = hashlib.sha256()
        for start, v in bounds:  # the parts overlapping [a, b)
            lo, hi = max(a, start), min(b, start + len(v))
            if lo < hi:
                h.update(v[lo - start : hi - start])
        return h.digest()

    return _combine(_threads().map(piece, _spans(at, piece_bytes)))


def read_hashed(path: Path, piece_bytes: int) -> tuple[np.ndarray, str]:
    """The whole file at `path` (read-only uint8, as long as the file is now) and its digest.
    Raises OSError (FileNotFoundError for a file gone meanwhile); a short read leaves the rest
    zero, which the digest then tells apart."""
    with open(path, "rb", buffering=0) as f:
        buf = np.empty(os.fstat(f.fileno()).st_size, dtype=np.uint8)
        digest = read_into(f.fileno(), piece_bytes, [(0, buf)])
    buf.flags.writeable = False  # shared by every request restoring it (keys.read_once)
    return buf, digest


def read_into(fd: int, piece_bytes: int, segments: list[tuple[int, np.ndarray]]) -> str:
    """Fill `segments` from the file `fd` and return its digest. `segments`: (file offset,
    writable uint8 array) in file order, tiling the file from offset 0 without gaps (an
    entry's header, then each tensor in memory of its own, say). Pieces are read and hashed
    on threads, each piece's bytes hashed right after they are read."""
    views = [(at, a.reshape(-1).view(np.uint8).data) for at, a in segments if a.size]
    size = max((at + len(v) for at, v in views), default=0)
    starts = [at for at, _ in views]

    def fill(a: int, b: int) -> list[memoryview]:
        """[a, b) of the file read into the segments it overlaps; those parts, in order."""
        parts = []
        i = max(bisect.bisect_right(starts, a) - 1, 0)
        while i < len(views) and views[i][0] < b:
            at, v = views[i]
            lo, hi = max(a, at), min(b, at + len(v))
            if lo < hi:
                _fill(fd, v[lo - at : hi - at], lo)
                parts.append(v[lo - at : hi - at])
            i += 1
        return parts

    if piece_bytes <= 0:
        h = hashlib.sha256()
        for a, b in _spans(size, PIECE_BYTES):
            for part in fill(a, b):
                h.update(part)
        return h.hexdigest()

    def piece(span: tuple[int, int]) -> bytes:
        h = hashlib.sha256()
        for part in fill(*span):
            h.update(part)
        return h.digest()

    jobs = [_threads().submit(piece, span) for span in _spans(size, piece_bytes)]
    wait(jobs)  # every piece done with the file before it closes, failed or not
    return _combine(j.result() for j in jobs)


def _fill(fd: int, view: memoryview, offset: int) -> None:
    """`view` from the file at `offset`, as far as the file goes (the rest zeroed)."""
    done = 0
    while done < len(view):
        n = _pread_into(fd, view[done:], offset + done)
        if n <= 0:
            view[done:] = bytes(len(view) - done)
            return
        done += n


if hasattr(os, "preadv"):

    def _pread_into(fd: int, view: memoryview, offset: int) -> int:
        return os.preadv(fd, [view], offset)

else:  # no preadv (macOS before Python 3.13, say): a copy per piece, still in its thread

    def _pread_into(fd: int, view: memoryview, offset: int) -> int:
        data = os.pread(fd, len(view), offset)
        view[: len(data)] = data
        return len(data)
