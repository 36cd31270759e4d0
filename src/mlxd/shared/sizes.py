"""Sizes in bytes as people write and read them: the one parser and the one printer.

Settings, flags and the environment accept a plain integer (bytes) or a number with a unit:
decimal `KB MB GB TB` (powers of 1000) and binary `KiB MiB GiB TiB` (powers of 1024), any case,
with or without a space ("1GiB", "512 MB", "1.5gib"). Everything a person reads (mlxctl,
errors, log lines; the dashboard mirrors `format_size` in app.js) prints through `format_size`.
"""

from __future__ import annotations

import argparse
import re
from decimal import ROUND_HALF_UP, Decimal
from typing import Annotated

from pydantic import BeforeValidator

UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}
PRINTED = ("B", "KiB", "MiB", "GiB", "TiB")
# No machine mlxd runs on holds an exbibyte; past it a size is a typo, and MLX's own limits
# (int64 arguments) would refuse it later, at a worse moment.
MAX_SIZE = 1 << 60
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def parse_size(value: object) -> int:
    """Bytes from an integer or a text such as "1GiB" or "512MB"; ValueError says why."""
    if isinstance(value, bool):
        raise ValueError("a size, not true or false")
    if isinstance(value, int):
        return _bounded(value, value)
    if isinstance(value, float) and value.is_integer():
        return _bounded(int(value), value)
    text = value if isinstance(value, str) else None
    match = _SIZE.fullmatch(text) if text is not None else None
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in UNITS:
        raise ValueError(
            f"{value!r} is not a size: give bytes (1073741824) or a number with a unit"
            " (512MB, 1GiB; KB MB GB TB are powers of 1000, KiB MiB GiB TiB of 1024)"
        )
    return _bounded(round(float(match.group(1)) * UNITS[unit]), value)


def _bounded(size: int, written: object) -> int:
    if size > MAX_SIZE:
        raise ValueError(f"{written!r} is more than any machine holds (at most 1024 PiB)")
    return size


def size_arg(text: str) -> int:
    """An argparse `type=`: a flag's size, its mistake said as parse_size says it."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _lenient(value: object) -> object:
    """For pydantic: unparseable values pass on, so the field's own type error names them."""
    if isinstance(value, str | float | int) and not isinstance(value, bool):
        return parse_size(value)
    return value


# A settings field in bytes that also takes a unit: `memory_budget_bytes: Bytes | None`.
Bytes = Annotated[int, BeforeValidator(_lenient)]


def format_size(n: int | float | None) -> str | None:
    """ "606 MiB", "1.5 GiB", "512 B": three significant figures at most, binary units.

    None stays None (a figure nobody reported), so callers can print "-" for it."""
    if n is None:
        return None
    value, unit = float(n), 0
    while abs(value) >= 1024 and unit < len(PRINTED) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{value:.0f} B"
    # Ties round up (Decimal of a float is exact), as JavaScript's toFixed does in app.js.
    step = Decimal("0.1") if abs(value) < 10 else Decimal(1)
    text = str(Decimal(value).quantize(step, rounding=ROUND_HALF_UP))
    if text == "1024" and unit < len(PRINTED) - 1:  # 1023.6 MiB reads better as 1 GiB
        text, unit = "1", unit + 1
    return f"{text.removesuffix('.0')} {PRINTED[unit]}"
