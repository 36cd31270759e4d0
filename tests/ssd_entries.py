"""SSD prompt-cache entries for the store's tests (tests/unit/test_ssd_store.py reads them
into NumPy memory, tests/integration/test_ssd_reads.py both ways the store reads)."""

from __future__ import annotations

import numpy as np

from mlxd.worker.cache import format as cache_format
from mlxd.worker.cache.ssd import SsdStore


def arrays():
    return {
        "0.k": np.arange(8, dtype=np.float32).reshape(1, 1, 2, 4),
        "0.v": np.ones((1, 1, 2, 4), dtype=np.float32),
    }


LAYOUT = ((1, 4, 1, 4, "float32"),)  # what arrays() is, for a one-layer model
KEY = cache_format.entry_key("", (1, 2))  # the entry seeded() writes


def seeded(folder):
    """A folder holding one good entry (tokens 1, 2) and return the store that wrote it."""
    store = SsdStore(folder, cap_bytes=1 << 20, layout=LAYOUT)
    store.scan()
    assert store.write("", (1, 2), arrays(), {}, None)
    return store


def orjson_load(path) -> dict:
    return cache_format.orjson.loads(path.read_bytes())


def damaged(folder, at: float) -> None:
    """Flip one byte of the folder's data file, `at` of the way in."""
    f = next(folder.glob("*.safetensors"))
    data = bytearray(f.read_bytes())
    data[min(int(len(data) * at), len(data) - 1)] ^= 0x01
    f.write_bytes(bytes(data))
