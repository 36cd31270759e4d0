"""The SSD write queue never blocks the engine (a full queue drops its oldest write) and
counts what landed and what failed."""

from __future__ import annotations

import errno
import threading

import numpy as np

from mlxd.worker.cache import format as cache_format
from mlxd.worker.cache.ssd import SsdStore
from mlxd.worker.cache.writer import CacheWriter, WriteJob


class SlowStore:
    """A store whose writes wait until the test opens the gate."""

    def __init__(self):
        self.gate = threading.Event()
        self.written: list[tuple[int, ...]] = []

    def write(self, ns, tokens, arrays, meta, session, queued_at=None, replies=()):
        self.gate.wait(30)
        self.written.append(tokens)
        return True

    def sync(self):
        return True


def job(i: int, outcomes: dict) -> WriteJob:
    return WriteJob(
        "",
        (i,),
        {"0.k": np.zeros(4, np.float32)},
        {},
        None,
        None,
        lambda ok, i=i: outcomes.__setitem__(i, ok),
    )


def test_full_queue_drops_oldest_and_never_blocks_the_caller():
    store = SlowStore()
    writer = CacheWriter(store, max_queued=4)
    writer.start()
    outcomes: dict[int, bool] = {}
    writer.put(job(0, outcomes))
    while writer.pending != 1 or writer._q:  # the writer has taken job 0 and is stuck in it
        pass
    for i in range(1, 41):  # the store is stuck: every put must still return at once
        writer.put(job(i, outcomes))
    assert writer.dropped == 36
    assert all(outcomes[i] is False for i in range(1, 37))  # the oldest queued ones
    store.gate.set()
    assert writer.flush(30)
    assert store.written == [(0,), (37,), (38,), (39,), (40,)]
    assert all(outcomes[i] is True for i in (0, 37, 38, 39, 40))


def test_outcomes_are_counted_so_a_drain_can_tell_what_landed(tmp_path, monkeypatch):
    store = SsdStore(tmp_path / "fp", cap_bytes=1 << 20)
    store.scan()
    writer = CacheWriter(store, max_queued=8)
    writer.start()
    outcomes: dict[int, bool] = {}
    writer.put(job(1, outcomes))
    assert writer.flush(30) and (writer.written, writer.failed) == (1, 0)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_format.os, "fsync", full)
    for i in range(2, 6):
        writer.put(job(i, outcomes))
    # Every write ended (the queue is empty) yet none landed, and the final fsync failed too.
    assert writer.flush(30) is False
    assert (writer.written, writer.failed) == (1, 4)
    assert outcomes == {1: True, 2: False, 3: False, 4: False, 5: False}
    assert store.stats["write_errors"] >= 1 and not list((tmp_path / "fp").glob("*.tmp"))


def test_a_write_for_a_closed_session_is_not_a_failure(tmp_path):
    store = SsdStore(tmp_path / "fp", cap_bytes=1 << 20)
    store.scan()
    writer = CacheWriter(store)
    writer.start()
    outcomes: dict[int, bool] = {}
    j = job(1, outcomes)
    j.session = "s"
    store.drop_session("s")
    writer.put(j)
    assert writer.flush(30) and (writer.written, writer.failed) == (0, 0)
    assert outcomes == {1: False}  # not on disk, and not counted against the drain


def test_an_unexpected_exception_in_a_write_fails_that_write_only(tmp_path):
    store = SsdStore(tmp_path / "fp", cap_bytes=1 << 20)
    store.scan()
    writer = CacheWriter(store)
    writer.start()
    outcomes: dict[int, bool] = {}
    bad = job(1, outcomes)
    bad.arrays = {"0.k": np.zeros(4, np.complex64)}  # no safetensors dtype for it
    writer.put(bad)
    writer.put(job(2, outcomes))
    assert writer.flush(30)
    assert outcomes == {1: False, 2: True} and (writer.written, writer.failed) == (1, 1)


def test_a_rescan_brings_the_index_in_line_with_what_another_process_did(tmp_path):
    """A hot reload's new worker scanned the folder at its start; the old one then wrote
    (its drain), evicted, and wrote entries of a session closed at the new one meanwhile
    (found by a probe and a review, 2026-12-07: turns after `mlxctl reload` missed)."""
    data = {"0.k": np.zeros((1, 1, 2, 4), np.float32), "0.v": np.zeros((1, 1, 2, 4), np.float32)}
    new = SsdStore(tmp_path / "fp", cap_bytes=1 << 20)
    old = SsdStore(tmp_path / "fp", cap_bytes=1 << 20)
    assert new.scan() == old.scan() == 0
    assert old.write("", (1, 2), data, {}, None)
    assert new.write("", (5, 6), data, {}, None)  # the new one's own entry
    assert old.write("", (7, 8), data, {}, None)
    new.drop_session("agent-1")
    assert old.write("", (3, 4), data, {}, "agent-1")  # the old one never heard of the close
    assert new.best("", [1, 2, 3])[1] == 0  # not indexed yet: the miss the probe saw
    old._remove(old.best("", [7, 8, 9])[0])  # the old one evicts (7, 8)
    assert new.rescan() == 1  # (1, 2); (3, 4) is a closed session's and is deleted
    assert new.best("", [1, 2, 3])[1] == 2 and new.best("", [5, 6, 9])[1] == 2
    assert new.best("", [7, 8, 9])[1] == 0 and new.best("", [3, 4, 9])[1] == 0
    assert not list((tmp_path / "fp").glob(f"{cache_format.entry_key('', (3, 4))}*"))
    assert new.rescan() == 0
