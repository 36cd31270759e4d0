"""Which SSD entries a worker reads back into RAM at start (worker/cache/read_ahead.py)."""

from __future__ import annotations

from mlxd.worker.cache.format import SsdEntry
from mlxd.worker.cache.read_ahead import pick


def entry(key: str, nbytes: int, used: float) -> SsdEntry:
    return SsdEntry(key, "ns", (1, 2, 3), nbytes, "0" * 64, None, used)


def test_newest_first_while_they_fit_and_a_smaller_older_one_fills_the_rest():
    old, mid, new, big = (
        entry("old", 30, 1.0),
        entry("mid", 50, 2.0),
        entry("new", 40, 3.0),
        (entry("big", 500, 4.0)),
    )
    # big is newest but larger than the room: skipped; then new (40), mid (50): 90 of 100;
    # old (30) no longer fits.
    assert [e.key for e in pick([old, mid, new, big], 100)] == ["new", "mid"]
    assert [e.key for e in pick([old, mid, new, big], 120)] == ["new", "mid", "old"]


def test_no_room_reads_nothing():
    assert pick([entry("a", 1, 1.0)], 0) == []
    assert pick([], 1 << 30) == []
