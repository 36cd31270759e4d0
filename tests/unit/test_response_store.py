"""The Responses store: survives reopening, expires by TTL, stays under its byte cap (LRU)."""

from __future__ import annotations

import orjson

from mlxd.supervisor.http.response_store import ResponseStore


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def record(i: int, size: int = 100) -> dict:
    return {"input": [{"role": "user", "content": "x" * size}], "response": {"id": f"r{i}"}}


def test_put_get_delete_and_reopen(tmp_path):
    path = tmp_path / "responses" / "r.sqlite3"
    store = ResponseStore(path, ttl_s=60, max_bytes=10_000)
    store.put("r1", record(1))
    assert store.get("r1") == record(1)
    assert store.get("nope") is None
    store.close()
    again = ResponseStore(path, ttl_s=60, max_bytes=10_000)
    assert again.get("r1") == record(1)
    assert again.delete("r1") and not again.delete("r1")
    assert again.get("r1") is None


def test_expired_records_are_gone(tmp_path):
    clock = Clock()
    store = ResponseStore(tmp_path / "r.sqlite3", ttl_s=60, max_bytes=10_000, clock=clock)
    store.put("old", record(1))
    clock.now += 61
    store.put("new", record(2))
    assert store.get("old") is None
    assert store.get("new") is not None


def test_byte_cap_evicts_least_recently_used(tmp_path):
    clock = Clock()
    cap = 4 * len(orjson.dumps(record(0)))  # room for four records
    store = ResponseStore(tmp_path / "r.sqlite3", ttl_s=0, max_bytes=cap, clock=clock)
    for i in range(3):
        store.put(f"r{i}", record(i))
        clock.now += 1
    store.get("r0")  # r0 is now the most recently used
    clock.now += 1
    for i in range(3, 6):
        store.put(f"r{i}", record(i))
        clock.now += 1
    assert store.stats() == {"responses": 4, "bytes": cap}
    assert store.get("r0") is not None
    assert store.get("r1") is None and store.get("r5") is not None
