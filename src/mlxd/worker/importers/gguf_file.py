"""Reading a GGUF file: its header (scalar metadata and each tensor's GGML type) and metadata
values as mx.load returns them. The GGML type facts the importer relies on live here too.
"""

from __future__ import annotations

import struct
from pathlib import Path

import mlx.core as mx

TYPE_NAMES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    30: "BF16",
}
# GGML types mx.load maps faithfully -> bits once imported (0: a float tensor, kept as is).
KEPT_BITS = {0: 0, 1: 0, 30: 0, 2: 4, 3: 4, 8: 8}
GROUP_SIZE = 32  # every GGUF block type mx.load keeps quantized has 32 weights per block


class GGUFImportError(ValueError):
    """The file cannot be imported: not GGUF, or an unsupported architecture or tensor type."""


def read_header(path: Path) -> tuple[dict, dict[str, int]]:
    """Read a GGUF header: ({scalar metadata key: value}, {tensor name: GGML type id}).

    Parsed here rather than taken from mx.load because mx.load silently turns some K-quants
    into float16 and fails on others with a bare message; the header says what each tensor is.
    """
    try:
        with open(path, "rb") as f:
            return _parse_header(f)
    except (OSError, struct.error, UnicodeDecodeError, MemoryError, OverflowError) as exc:
        raise GGUFImportError(f"{path}: not a readable GGUF file ({exc})") from exc


def _parse_header(f) -> tuple[dict, dict[str, int]]:
    fixed = dict(enumerate("BbHhIif?")) | {10: "Q", 11: "q", 12: "d"}  # GGUF value types

    def unpack(fmt: str):
        return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

    def value(vtype: int):
        if vtype in fixed:
            return unpack(fixed[vtype])
        if vtype == 8:  # string
            return f.read(unpack("Q")).decode("utf-8")
        if vtype != 9:
            raise GGUFImportError(f"{f.name}: corrupt GGUF header (value type {vtype})")
        etype, count = unpack("I"), unpack("Q")  # array: skipped, only scalars are kept
        if etype in fixed:
            f.seek(count * struct.calcsize(fixed[etype]), 1)
        else:
            for _ in range(count):
                value(etype)
        return None

    if f.read(4) != b"GGUF":
        raise GGUFImportError(f"{f.name}: not a GGUF file (bad magic bytes)")
    if (version := unpack("I")) not in (2, 3):
        raise GGUFImportError(f"{f.name}: unsupported GGUF version {version}")
    n_tensors, n_kv = unpack("Q"), unpack("Q")
    meta = {value(8): value(unpack("I")) for _ in range(n_kv)}
    types = {}
    for _ in range(n_tensors):
        name = value(8)
        f.seek(8 * unpack("I"), 1)  # dims
        types[name], _offset = unpack("I"), unpack("Q")
    return meta, types


def meta_value(meta: dict, key: str, default=KeyError):
    """`meta[key]` as a Python value (mx.load gives scalars as 0-d arrays); without a
    `default`, a missing key is a GGUFImportError."""
    if key not in meta:
        if default is KeyError:
            raise GGUFImportError(f"GGUF metadata lacks {key}")
        return default
    value = meta[key]
    return value.item() if isinstance(value, mx.array) and value.ndim == 0 else value
