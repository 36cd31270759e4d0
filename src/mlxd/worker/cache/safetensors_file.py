"""The safetensors layout of an SSD entry's data file: an 8-byte header length, a JSON header
(each tensor's dtype, shape and byte offsets), then the tensors' bytes in order. Writing it as
parts, and reading its header back, checked to tile the file, into specs or views. Pure NumPy
(format.py owns the entry around it: names, sidecar, digest, token ids)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import orjson

_ST_DTYPES: dict[str, str] = {
    "float32": "F32",
    "float16": "F16",
    "uint16": "U16",
    "uint32": "U32",
    "int32": "I32",
    "int64": "I64",
    "uint8": "U8",
    "int8": "I8",
}
_NP_DTYPES = {st: name for name, st in _ST_DTYPES.items()}


def safetensors_parts(tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> list:
    """A safetensors file as [header, buffer, buffer, ...] without joining the buffers.

    Writing and hashing the parts one by one (both release the GIL on large buffers) keeps the
    writer thread from stalling the engine thread the way building one big bytes object would.
    """
    header: dict = {"__metadata__": metadata}
    parts, offset = [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        header[name] = {
            "dtype": _ST_DTYPES[a.dtype.name],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + a.nbytes],
        }
        parts.append(a.data.cast("B"))  # `data`: the array's memoryview
        offset += a.nbytes
    head = orjson.dumps(header)
    head += b" " * (-len(head) % 8)  # the format aligns the data to 8 bytes
    return [len(head).to_bytes(8, "little") + head, *parts]


class TensorSpec(NamedTuple):
    """One tensor of a data file: its bytes are [start, stop) of the file."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int
    stop: int


# An entry's header is ~100 bytes a tensor (a few tensors a layer): 1 MiB is ~10k tensors, far
# above any model's, and bounds what a damaged header can ask of a read before its digest.
MAX_HEADER_BYTES = 1 << 20


def header_length(first8: bytes, size: int) -> int:
    """The header's length from a data file's first 8 bytes; ValueError when it cannot be."""
    n = int.from_bytes(first8, "little")
    if len(first8) < 8 or size < 8 or not 0 < n <= min(size - 8, MAX_HEADER_BYTES):
        raise ValueError("bad header length")
    return n


def parse_header(head: bytes, size: int) -> list[TensorSpec]:
    """The tensors of a `size`-byte data file whose first 8 + n bytes are `head`, in file
    order; ValueError unless they tile the rest of the file exactly (each its dtype's bytes,
    in order, nothing left over)."""
    n = header_length(head[:8], size)
    header = orjson.loads(head[8 : 8 + n])
    if not isinstance(header, dict):
        raise ValueError("bad header")
    header.pop("__metadata__", None)
    base, end, out = 8 + n, 0, []
    for name, t in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        dtype = np.dtype(_NP_DTYPES[t["dtype"]])
        shape = tuple(int(x) for x in t["shape"])
        start, stop = (int(x) for x in t["data_offsets"])
        count = int(np.prod(shape, dtype=np.int64))
        if start != end or stop - start != count * dtype.itemsize:
            raise ValueError(f"tensor {name} does not fit its place in the file")
        out.append(TensorSpec(name, dtype, shape, base + start, base + stop))
        end = stop
    if base + end != size:
        raise ValueError("bytes left over after the tensors")
    return out


def tensor_views(data: np.ndarray) -> dict[str, np.ndarray]:
    """A safetensors file's tensors as views of its bytes (`parse_header`'s checks)."""
    n = header_length(data[:8].tobytes(), len(data))
    specs = parse_header(data[: 8 + n].tobytes(), len(data))
    return {
        t.name: np.frombuffer(
            data, t.dtype, (t.stop - t.start) // t.dtype.itemsize, t.start
        ).reshape(t.shape)
        for t in specs
    }
