"""Lifecycle event counts, for /metrics and /admin."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Counters:
    """How many loads, refusals, evictions, unloads, crashes and reloads happened so far."""

    loads: int = 0
    load_failures: int = 0  # loads refused because the model does not fit
    evictions: int = 0
    unloads: int = 0
    crashes: int = 0
    reloads: int = 0
