"""Stored Responses API responses: TTL plus a byte-capped LRU, persisted with sqlite3.

A stored record is the full input a response answered (previous turns included) and the
response object itself, so `previous_response_id` continues a conversation even after its
worker was evicted or restarted, and after the daemon restarts.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("mlxd.responses")

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    used_at REAL NOT NULL,
    size_bytes INTEGER NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_used ON responses (used_at);
"""


class ResponseStore:
    """Keyed by response id. Times are wall-clock seconds: they must survive a restart."""

    def __init__(
        self, path: Path, *, ttl_s: float, max_bytes: int, clock: Callable[[], float] = time.time
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self.clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._expire()

    def put(self, rid: str, record: dict[str, Any]) -> None:
        """Store (or replace) `record`, then make room under the byte cap, oldest use first."""
        body = orjson.dumps(record)
        now = self.clock()
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                (rid, now, now, len(body), body),
            )
            self._evict()

    def get(self, rid: str) -> dict[str, Any] | None:
        """The record, or None when unknown, deleted or expired. A hit refreshes recency."""
        with self._lock:
            row = self._db.execute(
                "SELECT created_at, body FROM responses WHERE id = ?", (rid,)
            ).fetchone()
            if row is None:
                return None
            if self._expired(row[0]):
                self._db.execute("DELETE FROM responses WHERE id = ?", (rid,))
                return None
            self._db.execute("UPDATE responses SET used_at = ? WHERE id = ?", (self.clock(), rid))
        return orjson.loads(row[1])

    def delete(self, rid: str) -> bool:
        with self._lock:
            cur = self._db.execute("DELETE FROM responses WHERE id = ?", (rid,))
        return cur.rowcount > 0

    def stats(self) -> dict[str, int]:
        with self._lock:
            n, total = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM responses"
            ).fetchone()
        return {"responses": n, "bytes": total}

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- internals (lock held) ------------------------------------------------------------
    def _expired(self, created_at: float) -> bool:
        return self.ttl_s > 0 and created_at < self.clock() - self.ttl_s

    def _expire(self) -> None:
        if self.ttl_s > 0:
            self._db.execute(
                "DELETE FROM responses WHERE created_at < ?", (self.clock() - self.ttl_s,)
            )

    def _evict(self) -> None:
        self._expire()
        total = self._db.execute("SELECT COALESCE(SUM(size_bytes), 0) FROM responses").fetchone()[0]
        if total <= self.max_bytes:
            return
        victims = []
        for rid, size in self._db.execute(
            "SELECT id, size_bytes FROM responses ORDER BY used_at ASC, created_at ASC"
        ):
            if total <= self.max_bytes:
                break
            victims.append((rid,))
            total -= size
        self._db.executemany("DELETE FROM responses WHERE id = ?", victims)
        log.info("response store over its cap: evicted %d least recently used", len(victims))
