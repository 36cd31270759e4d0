"""The engine thread: the one thread that owns every MLX object of the worker.

Requests arrive as typed commands (commands.py) through a thread-safe inbox (inbox.py), wait in the
scheduler's queue until the batch has room (schedule.py: `batch` rows and the KV budget), and
are admitted between steps into mlx-lm's BatchGenerator (continuous batching: prefill in
chunks the planner sizes, interleaved with decode; rows leave as soon as they finish). Before
the first request, a warm-up runs the shapes the engine will use (warmup.py). One step's
rooms: admission.py (a submission becomes a row), batch.py (the rows in flight and their
prompt-cache hand-offs), emit.py (tokens become each row's events), recovery.py (a step that
failed), trace.py (what a step did, for tests).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, StopSequences
from mlx_lm.generate_utils import BatchStats
from mlx_lm.models.cache import make_prompt_cache

from mlxd.shared.errors import Unavailable
from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.engine.batch import Batch
from mlxd.worker.engine.commands import ENGINE_STOPPED, EngineCommands
from mlxd.worker.engine.emit import emit
from mlxd.worker.engine.figures import EngineFigures
from mlxd.worker.engine.recovery import is_out_of_memory, rebuild
from mlxd.worker.engine.rows import Row
from mlxd.worker.engine.sched.inbox import Command, Inbox
from mlxd.worker.engine.sched.memplan import MemoryPlan
from mlxd.worker.engine.sched.planner import PlanConfig
from mlxd.worker.engine.sched.schedule import Scheduler
from mlxd.worker.engine.step.generator import decode_batch, first_tokens, make_generator, step
from mlxd.worker.engine.step.speculate import SpecConfig
from mlxd.worker.engine.step.token import Clock
from mlxd.worker.engine.trace import StepTrace
from mlxd.worker.engine.warmup import timed_warm_up
from mlxd.worker.kv.budget import KvBudget
from mlxd.worker.kv.layers import attention_only
from mlxd.worker.lora.slots import Adapters
from mlxd.worker.model import head
from mlxd.worker.model.load import LoadedModel, apply_wired_limit
from mlxd.worker.model.prefill_check import padded_prefill_agrees
from mlxd.worker.vision.load import VisionParts

log = logging.getLogger("mlxd.worker.engine.loop")
SPEC_OFF = (
    "speculative decoding is off for this model: a rejected draft is undone by cutting the"
    " KV back, which its sliding-window or recurrent layers cannot do"
)

# Cache upkeep (write-behind, demotion) hands arrays to the SSD writer, which costs the engine
# a synchronisation: do it when idle, or at most this often under load.
UPKEEP_IDLE_S = 1.0
UPKEEP_BUSY_S = 30.0
DEFAULT_ADAPTER_CACHE_BYTES = 2 * 1024**3  # loaded LoRA factors (adapter_cache_bytes)


class Engine(EngineCommands, EngineFigures):
    """Owns the model's BatchGenerator on a dedicated thread.

    `plan` sizes the prefill chunks; `kv_budget_bytes` (None: no bound but `batch`) bounds
    the KV the batch's rows may hold (`memory_plan`: where it came from); `warmup` runs the
    shapes once before the first request (`warmed` is set after it); `trace`, when given,
    hears a StepTrace after every step.
    """

    grammars = True  # rows may carry their own logits processors (not on a worker group yet)
    lora = True  # rows may run with LoRA adapters (not on a worker group yet)

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        batch: int,
        plan: PlanConfig | None = None,
        kv_budget_bytes: int | None = None,
        cache: PromptCache | None = None,
        warmup: bool = True,
        trace: Callable[[StepTrace], None] | None = None,
        memory_plan: MemoryPlan | None = None,
        spec: SpecConfig | None = None,
        compile_decode: bool = False,
        first_token_from_prefill: bool = True,
        adapter_cache_bytes: int = DEFAULT_ADAPTER_CACHE_BYTES,
        vision: VisionParts | None = None,
    ):
        self.m = loaded
        self.vision = vision  # a VLM's vision half: image rows' features (worker/vision/)
        # The model's LoRA adapters (worker/lora/): layers are wrapped only at a first mount.
        self.adapters = Adapters(loaded.model, adapter_cache_bytes) if self.lora else None
        self.compile_decode = compile_decode  # the decode forward compiled (engine/compiled.py)
        self.cache = cache
        self.trimmable = attention_only(make_prompt_cache(loaded.model))
        if spec is not None and not self.trimmable:
            log.warning(SPEC_OFF)
            spec = None
        self.spec = spec  # speculative decoding of a lone row (None: off)
        self.batch_size = batch
        self.plan = plan or PlanConfig()
        self._inbox = Inbox()
        self._batch = Batch(cache, self.trimmable, self.adapters, vision)
        self.memory_plan = memory_plan  # where the KV budget came from (/stats reports it)
        why = memory_plan.explain() if memory_plan else "kv_budget_bytes"
        budget = KvBudget.of(loaded.kv_cost, kv_budget_bytes, batch, loaded.context_limit, why)
        self._sched = Scheduler(self._batch, batch, self.plan, budget)
        self._sched.serial_prefill = not padded_prefill_agrees(loaded.model)
        # A row's first token from its prefill forward (model/head.py), where it may be.
        self._batch.head = head.choose(loaded.model, first_token_from_prefill, self.trimmable)
        self.dead: str | None = None  # why the engine thread stopped unexpectedly
        self._gone = False  # the thread made its last take from the inbox (stopped or dead)
        self.closing = False  # a drain passed its deadline: admit nothing more
        self._stopping = False  # a Stop arrived: exit once the rows in flight are done
        self.debug_prefill_delay_s = 0.0  # test-only slow prefill, read by api.generation
        self._warmup = warmup
        self.warmup_s: float | None = None  # how long the warm-up took (None: not run)
        self.warmed = threading.Event()  # set once the warm-up is over (or skipped)
        self._trace = trace
        self.clock: Clock | None = None  # set before start(): where step time goes (profile)
        self._steps = 0
        self._totals = BatchStats()
        self._thread = threading.Thread(target=self._run, name="mlxd-engine", daemon=True)
        self._stopped = threading.Event()

    # -- called from the event loop -------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    # -- the engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # never leave requests waiting on a dead thread
            log.exception("engine thread stopped")
            self.dead = f"{type(exc).__name__}: {exc}"
            self._batch.fail_all(Unavailable(ENGINE_STOPPED))
            self._sched.fail_waiting(Unavailable(ENGINE_STOPPED))
        finally:
            self._gone = True  # from here on, whoever puts a command answers it (_put)
            self._answer_leftovers()
            self.warmed.set()
            self._stopped.set()

    def _loop(self) -> None:
        # Streams belong to the thread that creates them: make ours here.
        self._stream = mx.new_stream(mx.default_device())
        if self._warmup:
            m = self.m
            self.warmup_s = timed_warm_up(
                m.model,
                self._stream,
                self.plan,
                self.batch_size,
                m.context_limit,
                self.spec,
                self.compile_decode,
            )
        self.warmed.set()
        batch = self._batch
        batch.gen = self._new_generator()
        batch.eos = StopSequences([(t,) for t in self.m.eos_ids])
        batch.eos_ids = frozenset(self.m.eos_ids)
        last_upkeep = time.monotonic()
        while True:
            idle = not batch.rows and not self._sched.waiting and not self._stopping
            for cmd in self._commands(idle):
                self._handle(cmd)
            last_upkeep = self._upkeep(last_upkeep)
            admitted = self._sched.admit(self.m.tokenizer)
            if self._stopping and not batch.rows and not self._sched.waiting:
                break
            if batch.rows:
                self._step(admitted)
        batch.gen.close()

    def prefill_pace(self) -> float | None:
        """Prompt tokens per second of recent steps that prefilled (/stats); None: none yet."""
        rate = self._sched.pace.tokens_per_s
        return None if rate is None else round(rate, 1)

    def _commands(self, block: bool) -> Iterable[Command]:
        """This iteration's commands (a worker group's ranks share them: worker/group/)."""
        return self._inbox.take(block=block)

    def _upkeep(self, last_s: float) -> float:
        """Prompt-cache upkeep (write-behind, demotion) when due; returns when it last ran."""
        since = time.monotonic() - last_s
        due = since >= UPKEEP_IDLE_S and not self._batch.rows or since >= UPKEEP_BUSY_S
        if self.cache is None or not due:
            return last_s
        now = time.monotonic()
        try:
            self.cache.writes.maintain(now)
        except Exception:  # the cache is an optimisation: never a reason to stop
            log.exception("prompt-cache upkeep failed")
        return now

    def _step(self, admitted: list[Row]) -> None:
        """One step of the batch: prefill chunks and decode, then each row's events."""
        batch = self._batch
        chunk = self._sched.plan()
        t0 = time.perf_counter()
        try:
            gen = batch.generator()
            with gen.stats() as st:
                prompt_responses, responses = step(gen, self.trimmable, batch.head)
            firsts = first_tokens(gen)  # rows that got their first token in this step
        except Exception as exc:  # the batch state is now unusable: rebuild it
            log.exception(
                "engine step failed (rows %s)", ", ".join(r.sub.rid for r in batch.rows.values())
            )
            # A prefill that ran out of memory is retried in smaller chunks, every row kept.
            retry = is_out_of_memory(exc) and self._sched.shrink_prefill()
            rebuild(batch, self._new_generator, exc, keep_all=retry, wait=self._sched.oom_wait())
            took = time.perf_counter() - t0
            failed = type(exc).__name__
            self._traced(StepTrace(self._steps + 1, chunk, started=t0, seconds=took, failed=failed))
            return
        self._totals += st
        self._steps += 1
        chunks = self._sched.progress(prompt_responses)
        if chunks:
            self._sched.pace.observe(sum(n for _, n in chunks.values()), time.perf_counter() - t0)
        if not self.trimmable:
            try:
                batch.snapshot(prompt_responses)
            except Exception:  # a missed snapshot is a cache miss later, nothing more
                log.exception("prompt-boundary snapshot failed")
        before = {uid: row.sub.rid for uid, row in batch.rows.items()}
        batch.fail_broken()
        t1 = time.perf_counter()
        ahead = emit(batch, responses, firsts)
        t2 = time.perf_counter()
        if self.clock is not None:
            self.clock["step"] += t1 - t0
            self.clock["emit"] += t2 - t1
        if self._trace is not None:
            done = [rid for uid, rid in before.items() if uid not in batch.rows]
            decoded = [before[r.uid] for r in responses if r.uid in before]
            names = [row.sub.rid for row in admitted]
            queued = len(self._sched)
            st = StepTrace(self._steps, chunk, names, chunks, decoded, done, queued, t0, t2 - t0)
            st.preempted.extend(self._sched.preempted)
            st.sent_first.extend(before[u] for u in ahead if u in before)
            self._traced(st)

    def _traced(self, st: StepTrace) -> None:
        if self._trace is None:
            return
        try:
            self._trace(st)
        except Exception:  # an observer: never a reason to stop the engine
            log.exception("step trace callback failed")

    def _new_generator(self) -> BatchGenerator:
        if self.adapters is not None:  # the old generator's uids mean nothing to the new one
            self.adapters.reset()
        if self.vision is not None:
            self.vision.rows.reset()
        gen = make_generator(
            self.m.model,
            batch=self.batch_size,
            chunk=self.plan.idle_chunk,
            stream=self._stream,
            spec=self.spec,
            compiled=self.compile_decode,
        )
        decode_batch(gen).clock = self.clock
        if self.memory_plan is not None:  # the generator wired the whole working set
            apply_wired_limit(self.memory_plan.total_bytes)
        return gen
