"""What the engine shows the rest of the worker: counts, totals and the rows in flight, read
from any thread (/stats, /admin memory, the access log). Each reading is one attribute read
or one C-level copy, safe beside the engine thread; nothing here changes the engine. The
Engine (loop.py) is an EngineFigures; its loop owns the state these read."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from mlx_lm.generate_utils import BatchStats

from mlxd.worker.engine.batch import Batch
from mlxd.worker.engine.rows import FirstTokens, Row
from mlxd.worker.engine.sched.inbox import Inbox
from mlxd.worker.engine.sched.schedule import Scheduler
from mlxd.worker.engine.stats import engine_stats
from mlxd.worker.kv.budget import KvBudget

if TYPE_CHECKING:
    from mlxd.worker.engine.loop import Engine


class EngineFigures:
    """The engine's public figures (the state they read is the engine thread's)."""

    _batch: Batch
    _sched: Scheduler
    _inbox: Inbox
    _totals: BatchStats

    @property
    def active_rows(self) -> int:
        return len(self._batch)

    @property
    def queued_rows(self) -> int:
        """Rows not in the batch yet: on their way to the engine thread, or waiting for room."""
        return self._inbox.queued + len(self._sched)

    @property
    def cancellations(self) -> int:
        return self._batch.cancellations

    @property
    def requests_done(self) -> int:
        return self._batch.requests_done

    @property
    def preemptions(self) -> int:
        """Rows taken out of the batch for want of KV budget, to resume later (preempt.py)."""
        return self._sched.preemptions

    @property
    def recoveries(self) -> int:
        """Failed steps after which the batch state was rebuilt."""
        return self._batch.recoveries

    @property
    def totals(self) -> BatchStats:
        """Prompt and generation tokens and the seconds they took, since start."""
        return self._totals

    @property
    def first_tokens(self) -> FirstTokens:
        return self._batch.first_tokens

    @property
    def kv_budget(self) -> KvBudget | None:
        return self._sched.budget

    def rows_in_flight(self) -> list[Row]:
        """The rows in the batch now (one C-level copy: safe beside the engine thread)."""
        return list(self._batch.rows.values())

    def kv_reserved(self) -> int:
        """Bytes the KV budget counts for the rows in flight (any thread)."""
        return self._sched.kv_reserved()

    def stats(self) -> dict:
        """What /stats reports of the engine (stats.py)."""
        return engine_stats(cast("Engine", self))  # only an Engine is an EngineFigures
