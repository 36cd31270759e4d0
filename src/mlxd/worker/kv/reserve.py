"""KV reserved as rows grow: a row holds its prompt plus one block of output, and takes the
next block from the budget each time it crosses its reservation.

Pure (no MLX), like budget.py. A row asking `max_tokens: 32000` (every Claude Code request)
would otherwise be counted at 32k positions from its admission, though most rows end after a
few hundred tokens: counted by the block, many more rows run at once. The price is that a
block may not be there when a row needs it; then `plan_growth` picks rows to preempt, the
newest first (by admission order), as vLLM does: the oldest rows have the most work done and
the most tokens already streamed, and preempting the newest keeps the batch first come,
first served. Never preempted: the oldest row (so the batch always makes progress), a lone
row (it fits alone: `KvBudget.check_alone`) and rows whose state cannot be resumed; when only
those are left, the row takes its block over the budget (`over`, logged by the engine).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from mlxd.shared.kv_math import KV_STEP
from mlxd.worker.kv.budget import KvBudget

# Output positions a row reserves at a time: mlx-lm's BatchKVCache grows by this step too.
BLOCK = KV_STEP

K = TypeVar("K", bound=Hashable)  # what names a row (the engine: its generator uid)


def first_reservation(full: int, held: int, block: int = BLOCK) -> int:
    """Positions a row is counted at when it is admitted (again): the `held` it already has
    (its prompt, plus the tokens it wrote before a preemption) and one block of output, at
    most its `full` length (prompt plus max_tokens)."""
    return min(full, held + block)


def next_reservation(reserved: int, filled: int, full: int, block: int = BLOCK) -> int:
    """A row's reservation for the coming step: the same while its `filled` positions leave
    room for the token that step writes, else one more block (at most `full`)."""
    if filled < reserved or reserved >= full:
        return reserved
    return min(full, filled + block)


@dataclass(frozen=True)
class Held(Generic[K]):
    """One row as the reservation sees it."""

    key: K
    order: int  # admission order: lower is older
    reserved: int  # positions counted now
    filled: int  # positions its KV holds (prompt and tokens written so far)
    full: int  # its prompt plus max_tokens: never counted beyond
    resumable: bool = True  # its state survives a preemption


@dataclass
class Growth(Generic[K]):
    """What `plan_growth` decided: every kept row's reservation, the rows to preempt (newest
    first), and the rows that took a block over the budget (no row could make room)."""

    reserved: dict[K, int] = field(default_factory=dict)
    preempt: list[K] = field(default_factory=list)
    over: list[K] = field(default_factory=list)


def plan_growth(rows: Sequence[Held[K]], budget: KvBudget, block: int = BLOCK) -> Growth[K]:
    """Give every row that crossed its reservation its next block, preempting the newest
    preemptable rows while the batch's padded footprint exceeds the budget."""
    kept = sorted(rows, key=lambda r: r.order)
    want = {r.key: next_reservation(r.reserved, r.filled, r.full, block) for r in kept}
    out: Growth[K] = Growth()
    while budget.footprint([want[r.key] for r in kept]) > budget.budget_bytes:
        victim = next((r for r in reversed(kept[1:]) if r.resumable), None)
        if victim is None:
            out.over = [r.key for r in kept if want[r.key] > r.reserved]
            break
        kept.remove(victim)
        out.preempt.append(victim.key)
    out.reserved = {r.key: want[r.key] for r in kept}
    return out
