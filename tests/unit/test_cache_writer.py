"""The SSD write queue never blocks the engine: a full queue drops its oldest write."""

from __future__ import annotations

import threading

import numpy as np

from mlxd.worker.cache_writer import CacheWriter, WriteJob


class SlowStore:
    """A store whose writes wait until the test opens the gate."""

    def __init__(self):
        self.gate = threading.Event()
        self.written: list[tuple[int, ...]] = []

    def write(self, ns, tokens, arrays, meta, session, queued_at=None):
        self.gate.wait(30)
        self.written.append(tokens)
        return True

    def sync(self):
        pass


def job(i: int, outcomes: dict) -> WriteJob:
    return WriteJob("", (i,), {"0.k": np.zeros(4, np.float32)}, {}, None, None,
                    lambda ok, i=i: outcomes.__setitem__(i, ok))


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
