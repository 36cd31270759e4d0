"""The SSD store's reads, both ways it reads: into one NumPy buffer (a store without
`buffers`) and into an MLX array per tensor (kv_arrays.mlx_buffers, what the prompt cache
uses): an entry comes back as written, and any flipped byte, a lying header or another
model's shapes is a miss that deletes the entry, never a wrong restore."""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import pytest
from kv_layers import address
from ssd_entries import LAYOUT, arrays, damaged, orjson_load, seeded

from mlxd.worker.cache import format as cache_format
from mlxd.worker.cache import ssd as ssd_module
from mlxd.worker.cache.kv_arrays import _mlx_view, mlx_buffers
from mlxd.worker.cache.safetensors_file import TensorSpec
from mlxd.worker.cache.ssd import SsdStore


@pytest.fixture(params=["numpy", "mlx"])
def buffers(request):
    """What a read fills: one NumPy buffer (None), or an MLX array per tensor."""
    return None if request.param == "numpy" else mlx_buffers


def test_round_trip_and_restart_scan(tmp_path, buffers):
    store = SsdStore(tmp_path / "fp", cap_bytes=1 << 20, buffers=buffers)
    store.scan()
    assert store.write("", (1, 2), arrays(), {}, None)
    entry, n = store.best("", [1, 2, 3])
    assert n == 2
    got = store.read(entry)
    assert np.array_equal(got["0.k"], arrays()["0.k"])
    again = SsdStore(tmp_path / "fp", cap_bytes=1 << 20)
    assert again.scan() == 1 and again.best("", [1, 2, 9])[1] == 2


@pytest.mark.parametrize(
    "bad",
    [
        {"0.k": np.zeros((1, 1, 2, 8), np.float32), "0.v": np.zeros((1, 1, 2, 8), np.float32)},
        {"0.k": np.zeros((1, 2, 2, 4), np.float32), "0.v": np.zeros((1, 2, 2, 4), np.float32)},
        {"0.k": np.zeros((1, 1, 2, 4), np.float16), "0.v": np.zeros((1, 1, 2, 4), np.float16)},
        {
            **arrays(),
            "1.k": np.zeros((1, 1, 2, 4), np.float32),
            "1.v": np.zeros((1, 1, 2, 4), np.float32),
        },
        {"0.k": np.zeros((1, 1, 3, 4), np.float32), "0.v": np.zeros((1, 1, 3, 4), np.float32)},
    ],
    ids=["head-dim", "kv-heads", "dtype", "layers", "token-count"],
)
def test_valid_hash_wrong_shapes_is_a_miss_and_is_deleted(tmp_path, bad, buffers):
    folder = tmp_path / "fp"
    # Written by something with another layout (another model under a colliding fingerprint):
    # the file is intact, its hash is right, only its shapes are not this model's.
    SsdStore(folder, cap_bytes=1 << 20).write("", (1, 2), bad, {}, None)
    store = SsdStore(folder, cap_bytes=1 << 20, layout=LAYOUT, buffers=buffers)
    assert store.scan() == 1
    entry, n = store.best("", [1, 2, 3])
    assert n == 2
    assert store.read(entry) is None
    assert store.stats["rejected"] == 1 and store.stats["restores"] == 0
    assert store.best("", [1, 2, 3]) == (None, 0)
    assert list(folder.iterdir()) == []
    assert store.write("", (1, 2), arrays(), {}, None)  # the right entry can take its place
    assert store.read(store.best("", [1, 2, 3])[0]) is not None


@pytest.mark.parametrize("piece_bytes", [1, 7, 64, 1 << 20])
@pytest.mark.parametrize("at", [None, 0.0, 0.01, 0.5, 0.99, 1.0])
def test_any_flipped_byte_is_caught_whatever_the_piece_size(
    tmp_path, monkeypatch, piece_bytes, at, buffers
):
    monkeypatch.setattr(cache_format, "PIECE_BYTES", piece_bytes)
    monkeypatch.setattr(ssd_module, "PIECE_BYTES", piece_bytes)
    folder = tmp_path / "fp"
    seeded(folder)
    assert orjson_load(next(folder.glob("*.json")))["piece_bytes"] == piece_bytes
    if at is not None:
        damaged(folder, at)  # the header, a tensor, the token ids at the end
    store = SsdStore(folder, cap_bytes=1 << 20, layout=LAYOUT, buffers=buffers)
    assert store.scan() == 1
    got = store.read(store.best("", [1, 2, 3])[0])
    if at is None:
        assert got is not None and np.array_equal(got["0.k"], arrays()["0.k"])
    else:
        assert got is None and store.stats["corrupt"] == 1
        assert list(folder.iterdir()) == []


def test_an_entry_hashed_whole_by_an_older_writer_still_reads_and_is_still_checked(
    tmp_path, buffers
):
    for flip in (False, True):
        folder = tmp_path / f"fp{flip}"
        seeded(folder)
        meta = next(folder.glob("*.json"))
        info = orjson_load(meta)
        del info["piece_bytes"]  # as written before pieces: the whole file's SHA-256
        info["sha256"] = hashlib.sha256(meta.with_suffix(".safetensors").read_bytes()).hexdigest()
        meta.write_bytes(cache_format.orjson.dumps(info))
        if flip:
            damaged(folder, 0.5)
        store = SsdStore(folder, cap_bytes=1 << 20, layout=LAYOUT, buffers=buffers)
        assert store.scan() == 1
        got = store.read(store.best("", [1, 2, 3])[0])
        assert (got is None) == flip and store.stats["corrupt"] == int(flip)


def test_a_read_into_mlx_is_each_tensor_in_an_mlx_array_of_its_own(tmp_path):
    store = seeded(tmp_path / "fp")
    store.buffers = mlx_buffers
    got = store.read(store.best("", [1, 2, 3])[0])
    assert got is not None and np.array_equal(got["0.k"], arrays()["0.k"])
    owners = {id(a.base.obj) for a in got.values()}  # a memoryview of the MLX array
    assert len(owners) == len(got) and not any(a.flags.writeable for a in got.values())


def test_buffers_made_on_any_thread_are_mlx_memory(tmp_path):
    """Reads run on any thread of the event loop's executor; MLX streams belong to the thread
    that made them. Every thread's read still lands in MLX arrays (no fallback copy)."""
    specs = [
        TensorSpec(f"t{i}", np.dtype(np.uint16), (2, 8), 32 * i, 32 * i + 32) for i in range(9)
    ]
    got: list = []
    for _ in range(4):  # one fresh thread after another, then this one
        t = threading.Thread(target=lambda: got.append(mlx_buffers(specs)))
        t.start()
        t.join()
    got.append(mlx_buffers(specs))
    assert len(got) == 5
    for bufs in got:
        assert all(_mlx_view(b) is not None and b.flags.writeable for b in bufs)


def test_to_numpy_views_the_caches_own_buffers_or_device_made_copies(monkeypatch):
    """On CUDA the writer's CPU read would move an entry's buffer into managed memory and its
    pages to the host (the next turn faults them back): it reads copies there
    (test_ssd_write_policy.py says which writes). Elsewhere (Apple silicon, the CPU backend)
    it reads the entry in place, no copy."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from mlxd.worker.cache import kv_arrays
    from mlxd.worker.model.device import on_cuda

    c = KVCache()
    k = mx.arange(16, dtype=mx.float32).reshape(1, 1, 4, 4)
    c.state = (k, k + 1, 4)  # exactly its tokens: to_numpy's slice is the whole buffer
    mx.eval(c.state)
    for copy in (False, True):
        arrays, meta, keep = kv_arrays.to_numpy([c], copy=copy)
        assert meta == {"layers": "1"}
        assert np.array_equal(arrays["0.k"], np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
        assert np.array_equal(arrays["0.v"], arrays["0.k"] + 1)
        shared = arrays["0.k"].ctypes.data == address(c.keys)
        assert shared is not copy, f"copy={copy}: the writer read the entry's own buffer"
    monkeypatch.setattr(kv_arrays, "DEVICE_COPIES", None)
    assert kv_arrays.device_copies() is on_cuda()  # in place but on CUDA


def test_the_read_ahead_can_take_device_copies_of_a_read_entry(tmp_path):
    """from_numpy's `device_copy` (the read-ahead on CUDA): the caches hold copies, not the
    read's buffers, with the same values; without it they hold the read's memory."""
    from mlxd.worker.cache.kv_arrays import from_numpy

    store = seeded(tmp_path / "dc")
    store.buffers = mlx_buffers
    got = store.read(store.best("", [1, 2, 3])[0])
    assert got is not None
    for copy in (False, True):
        (layer,) = from_numpy(got, LAYOUT, device_copy=copy)
        keys, values = layer.state[:2]
        assert np.array_equal(np.array(keys), arrays()["0.k"])
        assert np.array_equal(np.array(values), arrays()["0.v"])
        shared = address(keys) == got["0.k"].ctypes.data
        assert shared is not copy
