"""Which idle models to evict so another fits: a pure function, testable without processes."""

from __future__ import annotations

from dataclasses import dataclass

from mlxd.shared.sizes import format_size


@dataclass(frozen=True)
class Resident:
    """A loaded (or loading) model as the policy sees it."""

    id: str
    footprint_bytes: int
    leases: int
    last_used: float
    pinned: bool
    evictable: bool = True  # False while starting or stopping


class DoesNotFit(Exception):
    """The model cannot fit even with every other model unloaded."""


def plan_eviction(
    residents: list[Resident], need_bytes: int, budget_bytes: int, max_loaded: int
) -> list[str] | None:
    """Ids to evict, least recently used first, so `need_bytes` fits; [] if it fits already.

    None when only busy, pinned or transitional models stand in the way (the caller waits).
    Raises DoesNotFit when the model is larger than the budget left over by pinned models.
    """
    pinned = sum(r.footprint_bytes for r in residents if r.pinned)
    if need_bytes > budget_bytes - pinned:
        held = f" ({format_size(pinned)} held by pinned models)" if pinned else ""
        raise DoesNotFit(
            f"needs {format_size(need_bytes)}, {format_size(max(0, budget_bytes - pinned))}"
            f" free of a {format_size(budget_bytes)} budget{held}"
        )
    used = sum(r.footprint_bytes for r in residents)
    count = len(residents)
    victims: list[str] = []
    for r in eviction_candidates(residents):
        if _fits(used, count, need_bytes, budget_bytes, max_loaded):
            break
        victims.append(r.id)
        used -= r.footprint_bytes
        count -= 1
    return victims if _fits(used, count, need_bytes, budget_bytes, max_loaded) else None


def eviction_candidates(residents: list[Resident]) -> list[Resident]:
    """The models an eviction may take, in the order it takes them (least recently used)."""
    return sorted(
        (r for r in residents if r.evictable and not r.pinned and r.leases == 0),
        key=lambda r: r.last_used,
    )


def _fits(used: int, count: int, need: int, budget: int, max_loaded: int) -> bool:
    return used + need <= budget and (max_loaded == 0 or count + 1 <= max_loaded)
