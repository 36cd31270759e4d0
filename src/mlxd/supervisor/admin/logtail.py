"""Read the end of a log file, or what was appended after an offset (`mlxctl logs -f`)."""

from __future__ import annotations

import os
from pathlib import Path

BLOCK_BYTES = 64 * 1024
MAX_TAIL_LINES = 10_000
MAX_READ_BYTES = 4 * 1024 * 1024  # one follow step never returns more than this


def tail(path: Path, n: int) -> tuple[list[str], int]:
    """The last `n` lines of `path` and the file size; ([], 0) when it does not exist."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            pos, data = size, b""
            while pos > 0 and data.count(b"\n") <= n:
                step = min(BLOCK_BYTES, pos)
                pos -= step
                f.seek(pos)
                data = f.read(step) + data
    except FileNotFoundError:
        return [], 0
    lines = data.decode(errors="replace").splitlines()
    return (lines[-n:] if n > 0 else []), size


def read_after(path: Path, offset: int) -> tuple[list[str], int]:
    """Complete lines appended after byte `offset`, and the offset to ask from next time.

    A file shorter than `offset` was truncated or replaced: read it from the start.
    """
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if offset > size:
                offset = 0
            f.seek(offset)
            data = f.read(min(size - offset, MAX_READ_BYTES))
    except FileNotFoundError:
        return [], 0
    end = data.rfind(b"\n") + 1  # keep a half-written last line for the next call
    return data[:end].decode(errors="replace").splitlines(), offset + end
