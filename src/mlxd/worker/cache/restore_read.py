"""An SSD entry's data file read into one buffer per tensor (the restore's read on MLX).

`read_checked` is the SSD store's read with its checks, either way it reads. `read_tensors`
reads the header first, asks `make` for one writable buffer per tensor (MLX
arrays made all at once, kv_arrays.mlx_buffers), then reads and hashes the file's pieces
into them on threads (digest.read_into). Each tensor then is an MLX array already: no copy
after the read, and no buffer shared between tensors.

Why not one buffer for the whole file: a fresh MLX array is filled (zeros) before anything
can be read into it, and that fill runs on one CPU stream's thread. For gemma3-12b's 1.36 GB
entry on the CUDA host that fill was ~0.54 s of a 0.77 s read (bench.restore, 2026-12-06):
a buffer per tensor lets several CPU streams fill them at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from mlxd.worker.cache.digest import read_hashed, read_into
from mlxd.worker.cache.format import Layout, SsdEntry, check_entry, check_file, decode_entry
from mlxd.worker.cache.safetensors_file import TensorSpec, header_length, parse_header

Buffers = Callable[[list[TensorSpec]], list[np.ndarray]]


def read_tensors(
    path: Path, piece_bytes: int, make: Buffers
) -> tuple[int, dict[str, np.ndarray], str]:
    """(file size, its tensors by name, its digest). Raises OSError (FileNotFoundError for a
    file gone meanwhile) or ValueError for a header that does not add up (damage)."""
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        n = header_length(os.pread(fd, 8, 0), size)
        head = os.pread(fd, 8 + n, 0)
        specs = parse_header(head, size)  # checks that the tensors tile the file
        bufs = make(specs)
        if any(b.nbytes != t.stop - t.start for t, b in zip(specs, bufs, strict=True)):
            raise ValueError("a buffer of the wrong size")
        head_buf = np.empty(8 + n, dtype=np.uint8)  # read again with the rest: the digest
        segments = [(0, head_buf)] + [(t.start, b) for t, b in zip(specs, bufs)]
        digest = read_into(fd, piece_bytes, segments)
    for b in bufs:
        b.flags.writeable = False  # shared by every request restoring it (keys.read_once)
    return size, {t.name: b for t, b in zip(specs, bufs)}, digest


def read_checked(
    path: Path, e: SsdEntry, layout: Layout | None, buffers: Buffers | None
) -> dict[str, np.ndarray]:
    """Entry `e`'s arrays from its data file at `path`, its size, digest, token ids and (with
    a layout) shapes checked: into one buffer per tensor from `buffers`, or with None into
    one NumPy buffer for the whole file (digest.read_hashed). Raises OSError for the disk,
    LayoutMismatch for another model's entry, anything else for damage."""
    if buffers is None:
        data, digest = read_hashed(path, e.piece_bytes)
        return decode_entry(data, digest, e, layout)
    size, arrays, digest = read_tensors(path, e.piece_bytes, buffers)
    check_file(size, digest, e)
    return check_entry(arrays, e, layout)
