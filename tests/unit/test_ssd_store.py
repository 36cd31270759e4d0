"""The SSD store on its own (NumPy only, real files): closed sessions stay closed, and faults
(junk that cannot be removed, refused unlinks, a full disk, leftovers, lying sidecars) cost a
miss and a counter, never the worker. Round trips, flipped bytes and entries of the wrong
shapes, read both ways the store reads: tests/integration/test_ssd_reads.py."""

from __future__ import annotations

import errno
import hashlib
import os
import time

import numpy as np
import pytest
from ssd_entries import KEY, LAYOUT, arrays, orjson_load, seeded

from mlxd.worker.cache import digest as cache_digest
from mlxd.worker.cache import format as cache_format
from mlxd.worker.cache import kinds as cache_kinds
from mlxd.worker.cache import restore_read
from mlxd.worker.cache.layout import safe_name, ssd_folder
from mlxd.worker.cache.restore_read import read_tensors
from mlxd.worker.cache.safetensors_file import MAX_HEADER_BYTES
from mlxd.worker.cache.ssd import SsdStore
from mlxd.worker.cache.ssd_leftovers import STALE_S


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


# -- faults: the SSD tier never stops a worker and never serves a wrong entry ----------------


def aged(path, data: bytes | None = None, age_s: float = 3600.0):
    """Backdate a file (made with `data` if given) so the scan sees it as a dead process's."""
    if data is not None:
        path.write_bytes(data)
    t = time.time() - age_s
    os.utime(path, (t, t))
    return path


def test_junk_that_cannot_be_removed_is_skipped_and_counted(tmp_path):
    folder = tmp_path / "fp"
    seeded(folder)
    (folder / "x.json").mkdir()  # a folder under an entry's name: neither read nor unlinked
    (folder / "y.safetensors").mkdir()
    (folder / "z.tmp").mkdir()
    aged(folder / "y.safetensors")
    aged(folder / "z.tmp")
    (folder / "junk.json").write_bytes(b"[1, 2")
    store = SsdStore(folder, cap_bytes=1 << 20, layout=LAYOUT)
    assert store.scan() == 1  # the good entry survives next to the junk
    assert store.disabled is None and store.errors >= 3
    assert store.stats["corrupt"] == 1 and not (folder / "junk.json").exists()
    entry, n = store.best("", [1, 2, 3])
    assert n == 2 and np.array_equal(store.read(entry)["0.k"], arrays()["0.k"])
    assert store.write("", (7, 8), arrays(), {}, None)  # and writes still land


def test_unlink_refused_everywhere_still_scans(tmp_path, monkeypatch):
    folder = tmp_path / "fp"
    seeded(folder)
    aged(folder / "left.safetensors.123.tmp", b"half")
    aged(folder / "orphan.safetensors", b"data without its metadata")
    (folder / "bad.json").write_bytes(b"{}")

    def refuse(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "unlink", refuse)
    store = SsdStore(folder, cap_bytes=1 << 20, layout=LAYOUT)
    assert store.scan() == 1
    assert store.stats["delete_errors"] >= 3 and store.stats["corrupt"] == 1
    assert store.best("", [1, 2, 3])[1] == 2


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder_with_a_tmp_serves_restores_and_skips_writes(tmp_path):
    folder = tmp_path / "fp"
    seeded(folder)
    aged(folder / "half.safetensors.99.tmp", b"half")
    folder.chmod(0o555)
    try:
        store = SsdStore(folder, cap_bytes=1 << 20, layout=LAYOUT)
        assert store.scan() == 1 and store.read_only
        assert store.stats["delete_errors"] == 1
        entry, _ = store.best("", [1, 2, 3])
        assert store.read(entry) is not None
        assert not store.write("", (7, 8), arrays(), {}, None)
        assert store.stats["write_skipped"] == 1
    finally:
        folder.chmod(0o755)


def test_folder_that_cannot_be_made_turns_the_tier_off(tmp_path):
    (tmp_path / "root").write_bytes(b"a file where the cache folder should be")
    store = SsdStore(tmp_path / "root" / "fp", cap_bytes=1 << 20, layout=LAYOUT)
    assert store.scan() == 0
    assert store.disabled and store.stats["scan_errors"] == 1
    assert store.best("", [1, 2, 3]) == (None, 0)
    assert not store.write("", (1, 2), arrays(), {}, None)
    assert store.sync() is False


def test_enospc_on_write_leaves_nothing_behind_and_pauses_writes(tmp_path, monkeypatch):
    store = SsdStore(tmp_path / "fp", cap_bytes=1 << 20, layout=LAYOUT)
    store.scan()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_format.os, "fsync", full)
    assert not store.write("", (1, 2), arrays(), {}, None)
    assert store.stats["write_errors"] == 1 and store.errors == 1
    assert list((tmp_path / "fp").iterdir()) == []  # no half-written or temporary file
    assert store.best("", [1, 2, 3]) == (None, 0)
    assert not store.write("", (3, 4), arrays(), {}, None)  # paused: no second full write
    assert store.stats["write_skipped"] == 1 and store.stats["write_errors"] == 1
    monkeypatch.undo()
    store._paused_until = 0.0  # the pause is over
    assert store.write("", (3, 4), arrays(), {}, None)


def test_renamed_or_lying_metadata_is_corrupt(tmp_path):
    folder = tmp_path / "fp"
    seeded(folder)
    meta = next(folder.glob("*.json"))
    data = meta.with_suffix(".safetensors")
    data.rename(folder / ("0" * 32 + ".safetensors"))
    meta.rename(folder / ("0" * 32 + ".json"))  # a name that is not its tokens' hash
    store = SsdStore(folder, cap_bytes=1 << 20, layout=LAYOUT)
    assert store.scan() == 0 and store.stats["corrupt"] == 1
    assert list(folder.iterdir()) == []


def test_fresh_temporary_files_of_a_live_writer_are_left_alone(tmp_path):
    folder = tmp_path / "fp"
    seeded(folder)
    (folder / "live.safetensors.77.tmp").write_bytes(b"being written")
    aged(folder / "dead.safetensors.66.tmp", b"left by a crash")
    SsdStore(folder, cap_bytes=1 << 20, layout=LAYOUT).scan()
    assert (folder / "live.safetensors.77.tmp").exists()
    assert not (folder / "dead.safetensors.66.tmp").exists()


def test_leftovers_of_a_crash_are_removed_at_start_and_counted(tmp_path):
    folder = tmp_path / "fp"
    seeded(folder)
    aged(folder / "half.tmp", b"half")
    aged(folder / "x.safetensors.4242.tmp", b"half")
    aged(folder / "orphan.safetensors", b"data without its sidecar")
    (folder / "notes.txt").write_bytes(b"not ours")
    store = SsdStore(folder, cap_bytes=1 << 20, layout=LAYOUT)
    assert store.scan() == 1
    assert store.leftovers.removed == 3 and not store.leftovers.waiting
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted([*(p.name for p in cache_format.entry_paths(folder, KEY)), "notes.txt"])


def test_leftovers_too_recent_at_start_go_once_old_unless_their_write_finished(tmp_path):
    """A recent leftover may be another worker's write in progress: it stays until the upkeep
    finds it old, and a data file whose sidecar appears meanwhile was a write, not junk."""
    folder = tmp_path / "fp"
    seeded(folder)
    (folder / "half.tmp").write_bytes(b"half")
    (folder / "orphan.safetensors").write_bytes(b"data without its sidecar")
    (folder / "landing.safetensors").write_bytes(b"a write in progress")
    store = SsdStore(folder, cap_bytes=1 << 20, layout=LAYOUT)
    assert store.scan() == 1
    assert store.leftovers.removed == 0 and len(store.leftovers.waiting) == 3
    now = time.time()
    assert store.sweep_leftovers(now) == 0  # still too recent
    (folder / "landing.json").write_bytes(b"{}")  # that writer finished its entry
    assert store.sweep_leftovers(now + STALE_S + 1) == 2
    assert not (folder / "half.tmp").exists() and not (folder / "orphan.safetensors").exists()
    assert (folder / "landing.safetensors").exists()
    assert store.leftovers.removed == 2 and not store.leftovers.waiting


def test_read_error_skips_the_entry(tmp_path, monkeypatch):
    store = seeded(tmp_path / "fp")
    entry, _ = store.best("", [1, 2, 3])

    def eio(path, piece_bytes):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(restore_read, "read_hashed", eio)
    assert store.read(entry) is None
    assert store.stats["read_errors"] == 1 and store.best("", [1, 2, 3]) == (None, 0)


def test_safe_names_are_plain_bounded_and_distinct():
    assert safe_name("tiny") == "tiny"
    names = {safe_name(i) for i in ("Tiny", "tiny", "a/b", "a_b", "a:b", "..", "../x", "x" * 300)}
    assert len(names) == 8
    for n in names:
        assert "/" not in n and n not in (".", "..") and len(n) <= 64 and n.strip(".")


def test_old_layout_folder_moves_under_the_model_id(tmp_path):
    seeded(tmp_path / "fp0")
    folder = ssd_folder(tmp_path, "org/model", "fp0")
    assert folder == tmp_path / safe_name("org/model") / "fp0"
    assert not (tmp_path / "fp0").exists()
    assert SsdStore(folder, cap_bytes=1 << 20, layout=LAYOUT).scan() == 1
    assert ssd_folder(tmp_path, "other", "fp0") == tmp_path / "other" / "fp0"  # starts empty


def test_each_layer_kind_names_its_tensors_and_a_window_or_state_must_match(tmp_path):
    rot = ("rotating", 1, 4, 1, 4, "uint16", 8, 0)
    layout = ((1, 4, 1, 4, "uint16"), rot, ("arrays", ((3, 6), "float32")))
    n = 12  # past the window of 8: the window holds 8 positions
    arrays = {
        "0.k": np.zeros((1, 1, n, 4), np.uint16),
        "0.v": np.zeros((1, 1, n, 4), np.uint16),
        "1.k": np.zeros((1, 1, 8, 4), np.uint16),
        "1.v": np.zeros((1, 1, 8, 4), np.uint16),
        "1.rot": np.array([n, 0, 8, 4], np.int64),
        "2.a0": np.zeros((1, 3, 6), np.float32),
    }
    cache_format.check_layout(arrays, layout, n)
    assert [cache_kinds.kind(x) for x in layout] == ["kv", "rotating", "arrays"]
    assert not cache_kinds.trims(layout) and cache_kinds.trims(layout[:1])
    bad = [
        {**arrays, "1.rot": np.array([n - 1, 0, 8, 4], np.int64)},  # made for other tokens
        {**arrays, "1.rot": np.array([n, 0, 16, 4], np.int64)},  # another window
        {**arrays, "2.a0": np.zeros((1, 3, 7), np.float32)},  # another state size
        {**arrays, "1.k": np.zeros((1, 1, 9, 4), np.uint16)},  # K and V of two lengths
        {k: v for k, v in arrays.items() if k != "2.a0"},
        {**arrays, "3.a0": np.zeros((1, 3, 6), np.float32)},
    ]
    for b in bad:
        with pytest.raises(cache_format.LayoutMismatch):
            cache_format.check_layout(b, layout, n)
    data, sidecar = cache_format.entry_paths(tmp_path, "abc")
    assert (data.name, sidecar.name) == ("abc.safetensors", "abc.json")


# -- the digest: pieces hashed on threads, every byte still covered ---------------------------


def test_a_read_is_one_pass_of_views_over_the_bytes_read(tmp_path):
    store = seeded(tmp_path / "fp")
    got = store.read(store.best("", [1, 2, 3])[0])
    assert got is not None
    bases = {id(a.base if a.base is not None else a) for a in got.values()}
    assert len(bases) == 1  # the tensors share the one buffer the read filled: no copies
    assert not any(a.flags.writeable for a in got.values())  # shared by concurrent restores


@pytest.mark.parametrize("cuts", [[], [1], [3, 3, 10], [0, 5, 5, 7, 190]])
def test_a_file_read_into_segments_has_the_digest_of_the_file(tmp_path, cuts):
    data = bytes(range(256)) * 3
    f = tmp_path / "f"
    f.write_bytes(data)
    bounds = [0, *cuts, len(data)]
    for n in (0, 1, 5, 64, 1 << 20):
        segments = [(a, np.zeros(b - a, np.uint8)) for a, b in zip(bounds, bounds[1:])]
        with open(f, "rb", buffering=0) as fh:
            digest = cache_digest.read_into(fh.fileno(), n, segments)
        assert digest == cache_digest.parts_digest([data], n)  # hashed from memory
        assert b"".join(seg.tobytes() for _, seg in segments) == data


def lying(tmp_path, header: dict, data: bytes):
    """A data file whose header is `header` (data_offsets as given), then `data`."""
    head = cache_format.orjson.dumps(header)
    head += b" " * (-len(head) % 8)
    f = tmp_path / "lying.safetensors"
    f.write_bytes(len(head).to_bytes(8, "little") + head + data)
    return f


@pytest.mark.parametrize(
    "offsets, data_bytes",
    [
        ([[0, 16], [20, 36]], 36),  # a gap between two tensors
        ([[0, 16], [8, 24]], 24),  # two tensors over the same bytes
        ([[0, 16], [16, 32]], 24),  # a tensor past the end of the file
        ([[0, 16], [16, 32]], 40),  # bytes left over after the tensors
        ([[16, 32], [0, 16]], 40),  # tensors out of order, and bytes left over
    ],
    ids=["gap", "overlap", "past-the-end", "left-over", "out-of-order"],
)
def test_a_header_that_does_not_tile_its_file_is_refused_before_any_buffer(
    tmp_path, offsets, data_bytes
):
    header = {
        f"t{i}": {"dtype": "F32", "shape": [4], "data_offsets": o} for i, o in enumerate(offsets)
    }
    f = lying(tmp_path, header, bytes(data_bytes))
    asked = []
    with pytest.raises(ValueError):
        read_tensors(f, 64, lambda specs: asked.append(specs) or [])
    assert asked == []  # nothing allocated for a header that lies


def test_a_header_length_past_its_bound_or_its_file_is_refused(tmp_path):
    f = tmp_path / "long.safetensors"
    for n, size in (
        (MAX_HEADER_BYTES + 8, MAX_HEADER_BYTES + 64),
        (64, 32),
    ):
        f.write_bytes(n.to_bytes(8, "little") + bytes(size))
        with pytest.raises(ValueError, match="header length"):
            read_tensors(f, 64, lambda specs: pytest.fail("asked for buffers"))


def test_piece_digests_of_parts_and_of_the_file_agree(tmp_path):
    parts = [b"abc", np.arange(100, dtype=np.uint16).data, b"", b"xyz" * 50]
    f = tmp_path / "f"
    f.write_bytes(b"".join(bytes(p) for p in parts))
    for n in (0, 1, 5, 64, 1 << 20):
        _, digest = cache_digest.read_hashed(f, n)
        assert cache_digest.parts_digest(parts, n) == digest
    assert cache_digest.parts_digest(parts, 0) == hashlib.sha256(f.read_bytes()).hexdigest()


@pytest.mark.parametrize("piece_bytes", [-1, "4", 1.5, "too small"])
def test_a_sidecar_with_an_impossible_piece_size_is_corrupt(tmp_path, monkeypatch, piece_bytes):
    folder = tmp_path / "fp"
    seeded(folder)
    meta = next(folder.glob("*.json"))
    info = orjson_load(meta)
    info["piece_bytes"] = piece_bytes
    if piece_bytes == "too small":  # so small that a read would queue a piece per byte
        monkeypatch.setattr(cache_format, "MAX_PIECES", 8)
        info["piece_bytes"] = 1
    meta.write_bytes(cache_format.orjson.dumps(info))
    store = SsdStore(folder, cap_bytes=1 << 20, layout=LAYOUT)
    assert store.scan() == 0 and store.stats["corrupt"] == 1
