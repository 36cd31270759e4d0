"""The SSD store on its own (NumPy only): round trip, and closed sessions stay closed."""

from __future__ import annotations

import time

import numpy as np

from mlxd.worker.cache_ssd import SsdStore


def arrays():
    return {"0.k": np.arange(8, dtype=np.float32).reshape(1, 1, 2, 4),
            "0.v": np.ones((1, 1, 2, 4), dtype=np.float32)}


def test_round_trip_and_restart_scan(tmp_path):
    store = SsdStore(tmp_path / "fp", cap_bytes=1 << 20)
    store.scan()
    assert store.write("", (1, 2), arrays(), {}, None)
    entry, n = store.best("", [1, 2, 3])
    assert n == 2
    got = store.read(entry)
    assert np.array_equal(got["0.k"], arrays()["0.k"])
    again = SsdStore(tmp_path / "fp", cap_bytes=1 << 20)
    assert again.scan() == 1 and again.best("", [1, 2, 9])[1] == 2


def test_a_write_queued_before_its_session_closed_does_not_land(tmp_path):
    store = SsdStore(tmp_path / "fp", cap_bytes=1 << 20)
    store.scan()
    queued = time.monotonic()
    store.drop_session("s")
    assert not store.write("", (5, 6), arrays(), {}, "s", queued_at=queued)
    assert store.best("", [5, 6, 7]) == (None, 0)
    assert not list((tmp_path / "fp").glob("*.safetensors"))
    # The id used again after the close is a new session: its writes land.
    assert store.write("", (5, 6), arrays(), {}, "s", queued_at=time.monotonic())
    assert store.best("", [5, 6, 7])[1] == 2
