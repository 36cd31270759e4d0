"""The engines of a worker group: rank 0's (LeadEngine) and its followers' (FollowerEngine).

Tensor-parallel ranks must make the same model calls in the same order, or a collective
inside the model waits forever. Both engines are the ordinary Engine (loop.py), with one
change: where the loop takes its inbox commands, rank 0 takes them, broadcasts the ones that
change the batch (wire.py: new rows, cancellations, the stop, the drain's close) and applies
them; each follower applies the same events at the same iteration. Everything else the loop
decides (admission under the batch size and KV budget, prefill chunks, stops, finishes)
follows from those events and from tokens, which agree on every rank: the logits are
all-reduced, the random seed and the KV budget are rank 0's (the hello).

So that rank 0's decisions never depend on timing, a cancellation takes effect (sets
`sub.cancelled`) when the event is applied, not when the request leaves, and a drain's
"admit nothing more" is an event too. The prompt cache runs on every rank with rank 0's
RAM cap: its trie changes only at admissions and row ends, which agree, and every rank's entry
for a prefix holds that rank's shard, of the same size, so hits and evictions agree too. Its
SSD tier keeps each rank's shard in a folder of its own, under the same entry name; idle
demotion (driven by time) is off, a drain's persist is an event, and an SSD restore rank 0
read for a row is made on every rank or on none (a vote of "mine is unusable" at the row's
event). Structured output (a grammar compiled on rank 0) is not offered on a group yet
(docs/scale-out.md).
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Iterable, Iterator

import mlx.core as mx

from mlxd.shared.errors import BadRequest, MlxdError, Unavailable
from mlxd.worker.cache.format import check_layout
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.rows import Event, Submission
from mlxd.worker.engine.sched.inbox import (
    Cancel,
    CloseGroup,
    CloseSession,
    Command,
    PersistCache,
    RunJob,
    Stop,
    Submit,
)
from mlxd.worker.engine.sched.planner import PlanConfig
from mlxd.worker.group import wire
from mlxd.worker.group.channel import Channel
from mlxd.worker.kv.budget import KvBudget

log = logging.getLogger("mlxd.worker.group")

NO_GRAMMAR = "Structured output is not available on a model served by a worker group"
NOT_ON_GROUP = "Embedding jobs are not available on a worker group"
# An iteration comes at least every IDLE_WAKE_S when idle and after every step when busy; one
# this late means the ranks are stuck in a collective (they parted): /health says so.
STALL_S = 300.0
STALL_CHECK_S = 5.0


class GroupDiverged(RuntimeError):
    """This rank can no longer step with the others: the group must restart."""


class Lockstep:
    """What both engines of a group share: a failed step ends the engine (a rebuild on one
    rank alone would part it from the others; the supervisor restarts the whole group), and
    so does a row one rank fails to admit."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._sched.lockstep = True

    def _new_generator(self):
        if self._batch.gen is not None:  # a rebuild after a failed step
            raise GroupDiverged("a step failed on this rank; the worker group must restart")
        return super()._new_generator()


class LeadEngine(Lockstep, Engine):
    """Rank 0: the ordinary engine, sharing each iteration's commands with its followers."""

    grammars = False  # a grammar compiled here could not run on the followers
    lora = False  # a mount here would have to reach every rank's model too

    def __init__(self, loaded, *, channel: Channel, **kw):
        super().__init__(loaded, **kw)
        self.channel = channel
        self._kv_budget_bytes = kw.get("kv_budget_bytes")
        self._seqs = itertools.count(1)
        self._seq_of: dict[int, int] = {}  # id(sub) -> its row's seq (engine thread only)
        self._beat: float | None = None  # when the last iteration began (None: not yet)
        threading.Thread(target=self._watch, name="mlxd-group-watch", daemon=True).start()

    def _watch(self) -> None:
        """Mark the engine dead (so /health fails and the group restarts) when no iteration
        came for STALL_S: a hang no rank can leave by itself."""
        while not self._stopped.wait(STALL_CHECK_S):
            beat = self._beat
            if beat is not None and self.dead is None and time.monotonic() - beat > STALL_S:
                log.error("no engine iteration for %.0fs: the worker group is stuck", STALL_S)
                self.dead = f"the worker group made no progress for {STALL_S:.0f}s"

    # -- the event loop's side -----------------------------------------------------------
    def submit(self, sub: Submission) -> None:
        if sub.processors:  # compiled here only: the followers could not apply it
            raise BadRequest(NO_GRAMMAR)
        sink = sub.sink

        def forget(event: Event, key: int = id(sub)) -> None:
            if event.finish_reason is not None:
                self._seq_of.pop(key, None)
            sink(event)

        sub.sink = forget
        super().submit(sub)

    def cancel(self, sub: Submission, reason: MlxdError | None = None) -> None:
        # sub.cancelled is set when every rank applies the cancel (_apply), never earlier.
        sub.cancel_reason = reason
        self._inbox.put(Cancel(sub))

    def cancel_all(self) -> int:
        self._inbox.put(CloseGroup())
        subs = [row.sub for row in list(self._batch.rows.values())] + list(self._sched.waiting)
        for sub in subs:
            self.cancel(sub, Unavailable("The model is being unloaded; this request was cancelled"))
        return len(subs)

    # -- the engine thread ---------------------------------------------------------------
    def _loop(self) -> None:
        seed = random.getrandbits(63)
        p = self.plan
        cap = self.cache.ram.cap_bytes if self.cache is not None else 0
        hello = wire.Hello(
            seed, p.idle_chunk, p.step_budget, p.min_chunk, self._kv_budget_bytes, cap
        )
        self.channel.exchange(wire.encode_hello(hello))
        mx.random.seed(seed)  # unseeded rows draw the same numbers on every rank
        super()._loop()

    def _commands(self, block: bool) -> Iterable[Command]:
        self._beat = time.monotonic()
        events: list[wire.RowEvent] = []
        local: list = []
        for cmd in self._inbox.take(block=block):
            if isinstance(cmd, Submit):
                sub = cmd.sub
                seq = self._seq_of[id(sub)] = next(self._seqs)
                events.append(
                    wire.RowEvent(
                        wire.SUBMIT,
                        seq,
                        sub.rid,
                        tuple(sub.prompt),
                        sub.params,
                        sub.ns,
                        sub.boundary,
                        sub.session,
                        tuple(sub.restored[0].tokens) if sub.restored else (),
                    )
                )
            elif isinstance(cmd, Cancel):
                live = self._seq_of.pop(id(cmd.sub), None)
                if live is None:
                    continue  # its row is over already: nothing to drop anywhere
                events.append(wire.RowEvent(wire.CANCEL, live))
            elif isinstance(cmd, Stop):
                events.append(wire.RowEvent(wire.STOP))
            elif isinstance(cmd, CloseGroup):
                events.append(wire.RowEvent(wire.CLOSE))
            elif isinstance(cmd, CloseSession):
                events.append(wire.RowEvent(wire.FORGET, session=cmd.session))
            elif isinstance(cmd, PersistCache):
                events.append(wire.RowEvent(wire.PERSIST))
            elif isinstance(cmd, RunJob):
                cmd.job.fail(Unavailable(NOT_ON_GROUP))
                continue
            local.append(cmd)
        self.channel.exchange(wire.encode(events))
        return self._apply(local)

    def _apply(self, cmds: list) -> Iterator[Command]:
        for cmd in cmds:
            if isinstance(cmd, CloseGroup):
                self.closing = True
                continue
            if isinstance(cmd, Cancel):
                cmd.sub.cancelled = True
            if isinstance(cmd, Submit) and cmd.sub.restored is not None:
                # Every rank restores its shard of the entry, or none does.
                if self.channel.any(False):
                    cmd.sub.restored = None
            yield cmd


class FollowerEngine(Lockstep, Engine):
    """A follower rank: the same engine, fed by rank 0's events; its rows' events go nowhere
    (rank 0 answers the requests)."""

    def __init__(self, loaded, *, channel: Channel, **kw):
        super().__init__(loaded, **kw)
        self.channel = channel
        self._subs: dict[int, Submission] = {}

    def _loop(self) -> None:
        hello = wire.decode_hello(self.channel.exchange())
        mx.random.seed(hello.seed)
        self.plan = PlanConfig(hello.idle_chunk, hello.step_budget, hello.min_chunk)
        self._sched.plan_cfg = self.plan
        m = self.m
        if self.cache is not None:  # the same cap: the same evictions as rank 0's
            self.cache.ram.cap_bytes = hello.cache_ram_bytes
        self._sched.budget = KvBudget.of(
            m.kv_cost,
            hello.kv_budget_bytes,
            self.batch_size,
            m.context_limit,
            "rank 0's memory plan",
        )
        super()._loop()

    def _commands(self, block: bool) -> Iterable[Command]:
        return self._apply(wire.decode(self.channel.exchange()))

    def _apply(self, events: list[wire.RowEvent]) -> Iterator[Command]:
        for e in events:
            if e.kind == wire.SUBMIT:
                assert e.params is not None
                sub = Submission(
                    rid=e.rid,
                    prompt=list(e.prompt),
                    params=e.params,
                    sink=self._sink(e.seq),
                    ns=e.ns,
                    session=e.session,
                    boundary=e.boundary,
                )
                if e.restore:  # rank 0 restores an SSD entry: this rank its own shard of it
                    sub.restored = self._read_shard(e.ns, e.restore)
                    if self.channel.any(sub.restored is None):
                        sub.restored = None
                self._subs[e.seq] = sub
                yield Submit(sub)
            elif e.kind == wire.CANCEL:
                gone = self._subs.pop(e.seq, None)
                if gone is not None:
                    gone.cancelled = True
                    yield Cancel(gone)
            elif e.kind == wire.STOP:
                yield Stop()
            elif e.kind == wire.CLOSE:
                self.closing = True
            elif e.kind == wire.FORGET and e.session is not None:
                yield CloseSession(e.session, threading.Event())
            elif e.kind == wire.PERSIST:
                yield PersistCache(threading.Event())

    def _read_shard(self, ns: str, tokens: tuple[int, ...]):
        """(entry, arrays) of this rank's SSD entry for exactly `tokens`, checked; None when
        it has none it can use (then no rank restores: the row prefills as a miss)."""
        cache = self.cache
        ssd = cache.ssd if cache is not None else None
        if ssd is None or ssd.layout is None:
            return None
        e, _ = ssd.best(ns, list(tokens))
        if e is None or tuple(e.tokens) != tokens:
            return None
        try:
            arrays = ssd.read(e)
            if arrays is None:
                return None
            check_layout(arrays, ssd.layout, len(tokens))
        except Exception as exc:  # this rank's copy is unusable: a miss on every rank
            log.warning("SSD shard of a restored entry unusable: %s", exc)
            return None
        return e, arrays

    def _sink(self, seq: int):
        def sink(event: Event) -> None:
            if event.finish_reason is not None:
                self._subs.pop(seq, None)
                if event.error is not None:  # rank 0 hears the same; a follower only logs it
                    log.warning("row %d ended in error: %s", seq, event.error)

        return sink
