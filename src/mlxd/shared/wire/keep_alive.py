"""Ollama's `keep_alive`: seconds, or a Go duration ("5m", "1h30m", "0"), as its API takes it
(shared by the /api/chat, /api/generate and embeddings bodies in ollama.py)."""

from __future__ import annotations

import math
import re

_DURATION = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_KEEP_ALIVE_S = 292 * 365.25 * 86400


def keep_alive_seconds(value: float | int | str | None) -> float | None:
    """Ollama's `keep_alive` in seconds: a number of seconds or a Go duration ("5m", "1h30m",
    "0"); negative keeps the model loaded for good (-1). None: the model's configured value."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        text = text.lstrip("+-")
        try:
            seconds = float(text)  # "300": plain seconds, which Ollama's Go parser refuses
        except ValueError:
            parts = _DURATION.findall(text)
            if not text or "".join(n + u for n, u in parts) != text:
                raise ValueError(
                    f"keep_alive {value[:40]!r} is not a duration such as '5m', '1h' or '0'"
                ) from None
            seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
        value = sign * seconds
    if math.isnan(value):
        raise ValueError("keep_alive must be a number of seconds or a duration")
    # Past ~292 years (Go's longest duration) it is "for good": a date that far is no date.
    return -1.0 if value < 0 or value > MAX_KEEP_ALIVE_S else float(value)


def check_keep_alive(cls, v):
    """A pydantic validator: a bad duration is a 400 before any model loads."""
    keep_alive_seconds(v)
    return v
