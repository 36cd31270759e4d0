"""The SSD tier of the prompt cache: one safetensors file per entry, verified on every read.

Files live in `<cache root>/<fingerprint>/`, so an entry never restores into a model it does
not belong to. Each entry is `<key>.safetensors` plus `<key>.json` (its token ids, byte size,
SHA-256 and session). Writes are atomic (temporary file, fsync, rename, fsync of the folder);
a truncated, corrupted or mismatched file is deleted and counted, never loaded. Pure NumPy and
file I/O: nothing here touches MLX, so it is safe off the engine thread.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import safetensors.numpy as stnp

from .cache_trie import TokenTrie

log = logging.getLogger("mlxd.worker.ssd")

FORMAT_VERSION = 1


@dataclass(eq=False)
class SsdEntry:
    key: str
    ns: str
    tokens: tuple[int, ...]
    file_bytes: int
    sha256: str
    session: str | None
    last_used: float


def entry_key(ns: str, tokens: tuple[int, ...]) -> str:
    h = hashlib.sha256(ns.encode() + b"\0" + np.asarray(tokens, dtype=np.uint32).tobytes())
    return h.hexdigest()[:32]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, *parts) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        for part in parts:
            f.write(part)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


_ST_DTYPES = {"float32": "F32", "float16": "F16", "uint16": "U16", "uint32": "U32",
              "int32": "I32", "uint8": "U8", "int8": "I8"}


def safetensors_parts(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> list:
    """A safetensors file as [header, buffer, buffer, ...] without joining the buffers.

    Writing and hashing the parts one by one (both release the GIL on large buffers) keeps the
    writer thread from stalling the engine thread the way building one big bytes object would.
    """
    header: dict = {"__metadata__": metadata}
    parts, offset = [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        header[name] = {"dtype": _ST_DTYPES[a.dtype.name], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        parts.append(memoryview(a).cast("B"))
        offset += a.nbytes
    head = orjson.dumps(header)
    head += b" " * (-len(head) % 8)  # the format aligns the data to 8 bytes
    return [len(head).to_bytes(8, "little") + head, *parts]


class SsdStore:
    """Index and files of one fingerprint's SSD entries. Thread-safe."""

    def __init__(self, folder: Path, cap_bytes: int):
        self.dir = folder
        self.cap_bytes = cap_bytes
        self.nbytes = 0
        self._entries: dict[str, SsdEntry] = {}
        self._tries: dict[str, TokenTrie[SsdEntry]] = {}
        self._lock = threading.RLock()
        self._closed_sessions: dict[str, float] = {}  # session -> when it was closed
        self.stats = {"hits": 0, "restores": 0, "writes": 0, "corrupt": 0, "evictions": 0,
                      "write_errors": 0}

    def __len__(self) -> int:
        return len(self._entries)

    # -- index ------------------------------------------------------------------------------
    def scan(self) -> int:
        """Index what a previous run left (restart survival); drop what is incomplete."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        for meta_path in sorted(self.dir.glob("*.json")):
            try:
                meta = orjson.loads(meta_path.read_bytes())
                data_path = meta_path.with_suffix(".safetensors")
                if data_path.stat().st_size != meta["file_bytes"]:
                    raise ValueError("size mismatch")
                e = SsdEntry(meta_path.stem, meta["ns"], tuple(meta["tokens"]),
                             meta["file_bytes"], meta["sha256"], meta.get("session"),
                             data_path.stat().st_mtime)
            except (OSError, ValueError, KeyError, TypeError):
                self._delete_files(meta_path.stem)
                self.stats["corrupt"] += 1
                continue
            self._add(e)
        for data_path in self.dir.glob("*.safetensors"):  # data without its metadata
            if data_path.stem not in self._entries:
                data_path.unlink(missing_ok=True)
        self._enforce_cap()
        return len(self._entries)

    def _add(self, e: SsdEntry) -> None:
        with self._lock:
            old = self._entries.get(e.key)
            if old is not None:
                self.nbytes -= old.file_bytes
            self._entries[e.key] = e
            self._tries.setdefault(e.ns, TokenTrie()).insert(e.tokens, e)
            self.nbytes += e.file_bytes

    def _remove(self, e: SsdEntry) -> None:
        with self._lock:
            if self._entries.pop(e.key, None) is not None:
                self.nbytes -= e.file_bytes
                self._tries[e.ns].remove(e.tokens)
        self._delete_files(e.key)

    def _delete_files(self, key: str) -> None:
        for suffix in (".safetensors", ".json"):
            (self.dir / (key + suffix)).unlink(missing_ok=True)

    def best(self, ns: str, prompt: list[int]) -> tuple[SsdEntry | None, int]:
        """The entry covering most of `prompt`, and how many tokens it covers.

        SSD entries hold plain KV caches, which trim: a longer entry that shares a prefix with
        the prompt serves that prefix. One prompt token always stays to be computed.
        """
        with self._lock:
            trie = self._tries.get(ns)
            m = trie.search(prompt) if trie else None
        if m is None:
            return None, 0
        best, n = None, 0
        if m.shorter is not None:
            best, n = m.shorter[1], min(len(m.shorter[0]), len(prompt) - 1)
        if m.longer is not None and min(m.common, len(prompt) - 1) > n:
            best, n = m.longer[1], min(m.common, len(prompt) - 1)
        return (best, n) if n > 0 else (None, 0)

    def contains(self, ns: str, tokens: tuple[int, ...]) -> bool:
        return entry_key(ns, tokens) in self._entries

    def drop_session(self, session: str) -> int:
        with self._lock:
            # Writes queued for it before now must not land; later use of the id starts afresh.
            self._closed_sessions[session] = time.monotonic()
            victims = [e for e in self._entries.values() if e.session == session]
        for e in victims:
            self._remove(e)
        return len(victims)

    # -- data -------------------------------------------------------------------------------
    def read(self, e: SsdEntry) -> dict[str, np.ndarray] | None:
        """The entry's arrays after checking size, hash and token ids; None (and deleted) if bad."""
        path = self.dir / (e.key + ".safetensors")
        try:
            data = path.read_bytes()
            if len(data) != e.file_bytes or hashlib.sha256(data).hexdigest() != e.sha256:
                raise ValueError("size or hash mismatch")
            arrays = stnp.load(data)
            if tuple(arrays.pop("__tokens__").tolist()) != e.tokens:
                raise ValueError("token ids mismatch")
        except FileNotFoundError:  # evicted meanwhile: a plain miss
            return None
        except (OSError, ValueError, KeyError) as exc:
            log.warning("discarding corrupt cache entry %s: %s", e.key, exc)
            self.stats["corrupt"] += 1
            if self._entries.get(e.key) is e:  # not a newer entry written under the same key
                self._remove(e)
            return None
        e.last_used = time.time()
        os.utime(path)
        self.stats["restores"] += 1
        return arrays

    def write(self, ns: str, tokens: tuple[int, ...], arrays: dict[str, np.ndarray],
              meta: dict[str, str], session: str | None,
              queued_at: float | None = None) -> bool:
        """Persist one entry atomically, then keep the folder under its byte cap.

        Returns whether the entry is now on disk."""
        key = entry_key(ns, tokens)
        tensors = {**arrays, "__tokens__": np.asarray(tokens, dtype=np.uint32)}
        parts = safetensors_parts(tensors, {**meta, "format": str(FORMAT_VERSION)})
        size = sum(len(p) for p in parts)
        if size > self.cap_bytes:
            return False
        h = hashlib.sha256()
        for part in parts:
            h.update(part)
        digest = h.hexdigest()
        try:
            _write_atomic(self.dir / (key + ".safetensors"), *parts)
            info = {"ns": ns, "tokens": list(tokens), "file_bytes": size, "sha256": digest,
                    "session": session, "format": FORMAT_VERSION}
            _write_atomic(self.dir / (key + ".json"), orjson.dumps(info))
            _fsync_dir(self.dir)
        except OSError as exc:
            log.error("cache write failed: %s", exc)
            self.stats["write_errors"] += 1
            self._delete_files(key)
            return False
        with self._lock:
            closed_at = self._closed_sessions.get(session) if session is not None else None
            if closed_at is not None and (queued_at is None or queued_at <= closed_at):
                self._delete_files(key)  # the session was closed while this write was queued
                return False
            self._add(SsdEntry(key, ns, tokens, size, digest, session, time.time()))
        self.stats["writes"] += 1
        self._enforce_cap()
        return True

    def sync(self) -> None:
        """Make renames durable (fsync of the folder)."""
        if self.dir.exists():
            _fsync_dir(self.dir)

    def _enforce_cap(self) -> None:
        while self.nbytes > self.cap_bytes:
            with self._lock:
                if not self._entries:
                    return
                victim = min(self._entries.values(), key=lambda e: e.last_used)
            self._remove(victim)
            self.stats["evictions"] += 1
