"""Who runs, and how much of their prompts each step prefills.

Submissions wait in our own FIFO queue until the batch has room: a free row (`batch`) and,
with a KV budget, room for the KV the row is counted at: its prompt and one block of output
(kv/reserve.py). Only then are they handed to mlx-lm's BatchGenerator, whose own queue so
stays empty. Before admitting, the rows that crossed their reservation take their next block;
where the budget has none, the newest rows are preempted (preempt.py) and wait at the front
of the queue, to resume where they stopped. Before each step the
planner (planner.py) picks the prefill chunk, set on the generator; after it, the prompt
progress mlx-lm reports becomes each row's position, for the next plan and the trace.

mlx-lm 0.32 internals used (pinned in pyproject.toml): `BatchGenerator.prefill_step_size`
(the chunk each prefilling row gets in `_next`) and `_prompt_batch.prefill_step_size` (the
forward size inside `PromptProcessingBatch.prompt`); both are set to the plan's chunk.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from dataclasses import replace

from mlxd.shared.errors import MlxdError
from mlxd.worker.engine.batch import Batch
from mlxd.worker.engine.recovery import generation_failed
from mlxd.worker.engine.rows import Event, Row, Submission
from mlxd.worker.engine.sched.admission import admit
from mlxd.worker.engine.sched.planner import PlanConfig, Prefilling, PrefillPace, plan_chunk
from mlxd.worker.engine.sched.preempt import park, resumable, resume
from mlxd.worker.kv.budget import KvBudget, row_tokens
from mlxd.worker.kv.reserve import Held, first_reservation, plan_growth
from mlxd.worker.model import mlx_lm_seam as seam

log = logging.getLogger("mlxd.worker.engine.loop")


class Scheduler:
    """The waiting queue, admission under `batch` and the KV budget, and the step's plan."""

    def __init__(self, batch: Batch, max_rows: int, plan: PlanConfig, budget: KvBudget | None):
        self.batch = batch
        self.max_rows = max_rows
        self.plan_cfg = plan
        self.budget = budget
        self.waiting: deque[Submission] = deque()
        # Preempted rows by id(submission): their submission waits in `waiting` meanwhile.
        self.parked: dict[int, Row] = {}
        self.preemptions = 0  # since start (/stats)
        self.preempted: list[str] = []  # the rows preempted before the coming step (trace)
        self._order = itertools.count()
        # Divides the planned chunk after a prefill ran out of memory (shrink_prefill); back
        # to 1 once the batch empties.
        self.oom_divisor = 1
        # After an allocation failure sent rows back to the queue (oom.py): admit no more
        # rows than stayed, until those rows (their submissions) have all left.
        self.oom_rows: int | None = None
        self.oom_stayed: set[Submission] = set()  # by identity (eq=False)
        # A worker group's ranks must admit alike: a row one rank fails to admit ends the
        # engine (and the group restarts) rather than leave that rank a row short.
        self.lockstep = False
        # One row prefilling at a time, for a model whose layers ignore a prefill's padding
        # (model/prefill_check.py): rows then never share a padded prefill forward.
        self.serial_prefill = False
        # Prompt tokens per second of the steps that prefilled (a busy step's time target).
        self.pace = PrefillPace()

    def __len__(self) -> int:
        return len(self.waiting)

    # -- the queue ------------------------------------------------------------------------
    def check(self, sub: Submission) -> None:
        """Any thread: refuse (413) a row that could never fit the KV budget, even alone. A
        row that asked for no max_tokens (the context's room) ends where the budget does."""
        if self.budget is None:
            return
        p = sub.params
        if p.max_tokens_open and p.max_tokens is not None:
            room = self.budget.output_room(len(sub.prompt))
            if 0 < room < p.max_tokens:
                sub.params = replace(p, max_tokens=room)
        self.budget.check_alone(len(sub.prompt), sub.params.max_tokens)

    def add(self, sub: Submission) -> None:
        self.waiting.append(sub)

    def cancel(self, sub: Submission) -> bool:
        """Take a waiting `sub` out of the queue; False when it is not waiting."""
        try:
            self.waiting.remove(sub)
        except ValueError:
            return False
        self._cancelled(sub)
        return True

    def _cancelled(self, sub: Submission) -> None:
        self.batch.cancellations += 1
        row = self.parked.pop(id(sub), None)
        if sub.cancel_reason is not None:
            sub.sink(Event.failure(sub.cancel_reason, row.generated if row else 0))

    def fail_waiting(self, err) -> None:
        while self.waiting:
            sub = self.waiting.popleft()
            row = self.parked.pop(id(sub), None)
            sub.sink(Event.failure(err, row.generated if row else 0))

    def admit(self, tokenizer) -> list[Row]:
        """Hand waiting rows to the batch, first come first served, while they fit."""
        admitted = []
        if not self.batch.rows:
            self.oom_divisor = 1  # a fresh start for the next rows
        if self.oom_rows is not None and not any(
            r.sub in self.oom_stayed for r in self.batch.rows.values()
        ):
            self.oom_rows, self.oom_stayed = None, set()  # the rows it was short for are gone
        self.grow()  # the running rows' next blocks come before new rows
        while self.waiting and self._room_for(self.waiting[0]):
            if self.serial_prefill and self._prefilling():
                break
            sub = self.waiting.popleft()
            if sub.cancelled:  # its Cancel command is still in the inbox: answer it here
                self._cancelled(sub)
                continue
            kv_tokens = self._first(sub)
            parked = self.parked.pop(id(sub), None)
            try:
                row = resume(self.batch, parked) if parked else admit(self.batch, sub, tokenizer)
            except Exception as exc:  # a bad restore or an MLX error: this row only
                log.exception("admitting %s failed", sub.rid)
                sent = parked.generated if parked else 0
                # A client's mistake (an adapter not mounted) is its own status, not a 503.
                err = exc if isinstance(exc, MlxdError) else generation_failed(sub.rid, exc)
                sub.sink(Event.failure(err, sent))
                if self.lockstep:
                    raise
                continue
            row.kv_tokens = kv_tokens
            if parked is None:
                row.seq = next(self._order)
            elif not row.generated:  # its wait counts as queueing in the first-token split
                row.admitted_at = time.monotonic()
            admitted.append(row)
        return admitted

    def grow(self) -> None:
        """Give the rows that crossed their reservation their next block; where the budget
        has none, preempt the newest rows (kv/reserve.py) to the front of the queue."""
        self.preempted = []
        if self.budget is None or len(self.batch.rows) == 0:
            return
        rows = {r.uid: r for r in self.batch.rows.values()}
        held = [
            Held(
                uid,
                r.seq,
                r.kv_tokens,
                len(r.sub.prompt) + r.generated,
                self._tokens(r.sub),
                resumable(r.sub),
            )
            for uid, r in rows.items()
        ]
        growth = plan_growth(held, self.budget)
        for uid in growth.preempt:  # newest first: the oldest of them ends up first in line
            row = rows[uid]
            park(self.batch, row)
            self.parked[id(row.sub)] = row
            self.waiting.appendleft(row.sub)
            self.preempted.append(row.sub.rid)
        self.preemptions += len(growth.preempt)
        for uid, n in growth.reserved.items():
            rows[uid].kv_tokens = n
        if self.preempted:
            log.info("KV budget: preempted %s (resumed when room frees)", self.preempted)
        if growth.over:
            names = [rows[uid].sub.rid for uid in growth.over]
            log.warning("KV budget: %s grew past it (no row could be preempted)", names)

    def oom_wait(self):
        """Where rows an allocation failure sends back go (wait_after_oom); None in a worker
        group, whose ranks must admit alike: there they fail as before."""
        return None if self.lockstep else self.wait_after_oom

    def wait_after_oom(self, rows: list[Row], stayed: list[Row]) -> None:
        """Rows an allocation failure sent back (oom.py), oldest first: to the front of the
        queue, to resume where they stopped; until the rows that `stayed` have all left, no
        more rows than they were run at once."""
        for row in reversed(rows):
            row.sub.oom_waits += 1
            self.parked[id(row.sub)] = row
            self.waiting.appendleft(row.sub)
        cap = len(stayed) if self.oom_rows is None else min(self.oom_rows, len(stayed))
        self.oom_rows, self.oom_stayed = cap, self.oom_stayed | {r.sub for r in stayed}
        log.warning(
            "out of memory: %s wait for room; at most %d rows until the batch empties",
            [r.sub.rid for r in rows],
            self.oom_rows,
        )

    def _prefilling(self) -> bool:
        return any(r.todo > 0 for r in self.batch.rows.values())

    def _room_for(self, sub: Submission) -> bool:
        rows = self.batch.rows.values()
        if len(rows) >= min(self.max_rows, self.oom_rows or self.max_rows):
            return False
        if self.budget is None or not rows:  # an empty batch takes any row that passed check()
            return True
        running = [max(r.kv_tokens, len(r.sub.prompt) + r.generated) for r in rows]
        return self.budget.admits(running, self._first(sub))

    def _first(self, sub: Submission) -> int:
        """Positions a row is counted at when admitted: its prompt (and the tokens it wrote
        before a preemption) plus one block; a row that cannot be resumed, its whole length."""
        full = self._tokens(sub)
        if self.budget is None or not resumable(sub):
            return full
        parked = self.parked.get(id(sub))
        return first_reservation(full, len(sub.prompt) + (parked.generated if parked else 0))

    def _tokens(self, sub: Submission) -> int:
        if self.budget is None:
            return row_tokens(len(sub.prompt), sub.params.max_tokens)
        return self.budget.tokens(len(sub.prompt), sub.params.max_tokens)

    def kv_reserved(self) -> int:
        """Bytes the KV budget counts for the rows in the batch now (any thread)."""
        if self.budget is None:
            return 0
        rows = list(self.batch.rows.values())  # one C-level copy: safe beside the engine thread
        return self.budget.footprint([r.kv_tokens for r in rows])

    # -- the step -------------------------------------------------------------------------
    def plan(self) -> int:
        """Pick this step's prefill chunk and set it on the generator."""
        rows = self.batch.rows.values()
        decoding = sum(1 for r in rows if r.todo == 0)
        pre = [Prefilling(r.todo, r.started) for r in rows if r.todo > 0]
        chunk = plan_chunk(
            decoding, pre, self.plan_cfg, self.pace.tokens_in(self.plan_cfg.step_target_s)
        )
        if self.oom_divisor > 1:
            chunk = max(min(chunk, self.plan_cfg.min_chunk), chunk // self.oom_divisor)
        seam.set_prefill_chunk(self.batch.generator(), chunk)
        return chunk

    def shrink_prefill(self) -> bool:
        """After an out-of-memory step with rows prefilling: halve the chunks from now on
        (a prefill's transient buffers grow with rows x chunk x context). False when rows
        were not prefilling or the chunk is already at its smallest: then the rows fail."""
        rows = list(self.batch.rows.values())
        if not any(r.todo > 0 for r in rows):
            return False
        cfg = self.plan_cfg
        if cfg.idle_chunk // self.oom_divisor <= cfg.min_chunk:
            return False
        self.oom_divisor *= 2
        log.warning(
            "out of memory while prefilling: chunks divided by %d from now on", self.oom_divisor
        )
        return True

    def progress(self, prompt_responses) -> dict[str, tuple[int, int]]:
        """Rows' prompt progress after a step: {rid: (start, tokens)} prefilled in it."""
        chunks = {}
        for r in prompt_responses:
            row = self.batch.rows.get(r.uid)
            if row is None:
                continue
            done, total = r.progress
            todo = 0 if r.end_of_prompt else max(0, total - done - self.batch.held_back)
            n = row.todo - todo
            if n > 0 and not r.end_of_prompt:
                chunks[row.sub.rid] = (row.pos, n)
                row.pos += n
            row.todo = todo
            row.started = True
            # A resumed row prefills its prompt again: what was done stays done.
            size = len(row.sub.prompt)
            done = size if r.end_of_prompt else min(row.pos, size)
            row.sub.prompt_done = max(row.sub.prompt_done, done)
        return chunks
