"""A GGUF file opened with the `gguf` package (llama.cpp's own reader): metadata values, the
tensor table, and the GGML type facts the importer relies on.

The reader memory-maps the file, so opening it reads only the header; a tensor's bytes are
paged in when the importer converts that tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

# Block types mapped exactly onto MLX affine quantization (same grid, group size 32).
KEPT_BITS = {T.Q4_0: 4, T.Q4_1: 4, T.Q8_0: 8}
FLOAT_TYPES = frozenset({T.F32, T.F16, T.BF16})
# Block types dequantized, then quantized to MLX affine at these bits: a K-quant's 32-weight
# sub-blocks at 4 bits or fewer fit MLX 4-bit; five or six bits need MLX 8-bit not to lose.
REQUANT_BITS = {
    T.Q2_K: 4,
    T.Q3_K: 4,
    T.Q4_K: 4,
    T.IQ4_NL: 4,
    T.IQ4_XS: 4,
    T.Q5_0: 8,
    T.Q5_1: 8,
    T.Q5_K: 8,
    T.Q6_K: 8,
}
ACCEPTED = FLOAT_TYPES | KEPT_BITS.keys() | REQUANT_BITS.keys()
GROUP_SIZE = 32


class GGUFImportError(ValueError):
    """The file cannot be imported: not GGUF, or an unsupported architecture or tensor type."""


def type_name(ggml_type: int) -> str:
    """`Q4_K` for a GGML type id, or `GGML type N` for one this gguf version does not know."""
    try:
        return T(ggml_type).name
    except ValueError:
        return f"GGML type {ggml_type}"


def supported_types() -> str:
    """The tensor types an import accepts, for error messages and docs."""
    return ", ".join(t.name for t in (*FLOAT_TYPES, *KEPT_BITS, *REQUANT_BITS))


@dataclass
class GGUFFile:
    """One open GGUF file: `value(key)` for metadata, `tensors` by GGUF name."""

    path: Path
    reader: gguf.GGUFReader
    tensors: dict[str, Any] = field(default_factory=dict)  # name -> gguf ReaderTensor

    @classmethod
    def open(cls, path: Path) -> GGUFFile:
        """Open and check the header; GGUFImportError for anything that is not a GGUF file."""
        path = Path(path)
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
        except OSError as exc:
            raise GGUFImportError(f"{path}: cannot read ({exc.strerror or exc})") from exc
        if magic != b"GGUF":
            raise GGUFImportError(f"{path}: not a GGUF file (bad magic bytes)")
        try:
            reader = gguf.GGUFReader(path)
        except (ValueError, OSError, IndexError, KeyError, UnicodeDecodeError) as exc:
            raise GGUFImportError(f"{path}: not a readable GGUF file ({exc})") from exc
        opened = cls(path, reader, {t.name: t for t in reader.tensors})
        if opened.value("general.architecture", None) is None:
            raise GGUFImportError(f"{path}: GGUF metadata lacks general.architecture")
        return opened

    def value(self, key: str, default: Any = KeyError) -> Any:
        """A metadata value as Python (str, int, float, bool or list); without a `default`,
        a missing key is a GGUFImportError naming it."""
        f = self.reader.fields.get(key)
        if f is None:
            if default is KeyError:
                raise GGUFImportError(f"GGUF metadata lacks {key}")
            return default
        return f.contents()

    @property
    def arch(self) -> str:
        return str(self.value("general.architecture"))

    def tensor_type(self, name: str) -> int:
        return int(self.tensors[name].tensor_type)

    def float_array(self, name: str) -> np.ndarray:
        """A float tensor (F32/F16/BF16) as float32 in row-major (PyTorch/MLX) order."""
        t = self.tensors[name]
        shape = tuple(int(d) for d in reversed(t.shape))
        if t.tensor_type == T.BF16:
            # numpy has no bfloat16: widen the 16 bits into the top of a float32
            raw = np.asarray(t.data).view(np.uint16).astype(np.uint32) << 16
            return raw.view(np.float32).reshape(shape)
        return np.asarray(t.data, dtype=np.float32).reshape(shape)

    def blocks(self, name: str) -> np.ndarray:
        """A block-quantized tensor's bytes, one row per output row: (rows, bytes per row)."""
        t = self.tensors[name]
        return np.asarray(t.data).reshape(-1, t.data.shape[-1])

    def dequantized(self, name: str) -> np.ndarray:
        """Any tensor as float32 (gguf.quants does the block formats)."""
        t = self.tensors[name]
        if t.tensor_type in FLOAT_TYPES:
            return self.float_array(name)
        shape = tuple(int(d) for d in reversed(t.shape))
        return gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(shape)
