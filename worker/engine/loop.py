"""The engine thread: the one thread that owns every MLX object of the worker.

Requests arrive through a thread-safe inbox and are admitted between decode steps, at every
step, into mlx-lm's BatchGenerator (continuous batching: prefill in chunks interleaved with
decode, rows leave as soon as they finish). Each generated token goes through the row's
TextStream and comes back to the request's asyncio side through its `sink`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, StopSequences
from mlx_lm.generate_utils import BatchStats
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler

from mlxd.shared.errors import MlxdError, Unavailable
from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.engine.logprobs import logprob_entry
from mlxd.worker.engine.recovery import (
    blame,
    generation_failed,
    guard_processor,
    guard_sampler,
)
from mlxd.worker.engine.rows import Event, Row, Submission
from mlxd.worker.engine.sampling import make_row_processors, make_row_sampler
from mlxd.worker.engine.textstream import TextStream, make_detokenizer
from mlxd.worker.model import LoadedModel

log = logging.getLogger("mlxd.worker.engine.loop")

# Clients hear this; why the thread stopped is in the log and in /health (`dead`).
ENGINE_STOPPED = "The engine of this worker stopped; the worker log has the details"


class Engine:
    """Owns the model's BatchGenerator on a dedicated thread."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        batch: int,
        prefill_step: int = 512,
        cache: PromptCache | None = None,
    ):
        self.m = loaded
        self.cache = cache
        # Trimmable caches (plain KV) serve any shared prefix, so one snapshot per request at
        # its end suffices; other cache types need snapshots at exact prompt boundaries.
        self.trimmable = can_trim_prompt_cache(make_prompt_cache(loaded.model))
        self.batch = batch
        self.prefill_step = prefill_step
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._rows: dict[int, Row] = {}
        self._by_sub: dict[int, Row] = {}
        # Two counters, each written by one thread only: queued = submitted - admitted.
        self._submitted = 0
        self._admitted = 0
        self.dead: str | None = None  # why the engine thread stopped unexpectedly
        self.closing = False  # a drain passed its deadline: admit nothing more
        self._broken: list[tuple[Submission, Exception]] = []  # rows whose processor raised
        self._totals = BatchStats()
        self.cancellations = 0
        self.requests_done = 0
        self.recoveries = 0  # failed steps after which the batch state was rebuilt
        self._thread = threading.Thread(target=self._run, name="mlxd-engine", daemon=True)
        self._stopped = threading.Event()

    # -- called from the event loop -------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, sub: Submission) -> None:
        if self.dead is not None:
            sub.sink(Event.failure(Unavailable(ENGINE_STOPPED)))
            return
        self._submitted += 1
        self._inbox.put(("submit", sub))

    def cancel(self, sub: Submission, reason: MlxdError | None = None) -> None:
        """Drop `sub`'s row at the next step; with a `reason`, its request hears why."""
        sub.cancelled = True
        sub.cancel_reason = reason
        self._inbox.put(("cancel", sub))

    def cancel_all(self) -> int:
        """Cancel every row still running or queued (a drain deadline passed)."""
        self.closing = True  # submissions still on their way get refused, not admitted
        subs = [row.sub for row in list(self._rows.values())]
        for sub in subs:
            self.cancel(sub, Unavailable("The model is being unloaded; this request was cancelled"))
        return len(subs)

    def persist_cache(self) -> threading.Event:
        """Queue every RAM cache entry for the SSD tier; the event is set once queued."""
        done = threading.Event()
        self._inbox.put(("persist", done))
        return done

    def close_session(self, session: str) -> threading.Event:
        done = threading.Event()
        self._inbox.put(("close_session", (session, done)))
        return done

    def stop(self) -> None:
        """Ask the thread to exit once in-flight rows are done or cancelled."""
        self._inbox.put(("stop", None))

    def join(self, timeout_s: float | None = None) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def active_rows(self) -> int:
        return len(self._rows)

    @property
    def queued_rows(self) -> int:
        return max(0, self._submitted - self._admitted)

    def stats(self) -> dict:
        t = self._totals
        return {
            "rows_active": len(self._rows),
            "rows_queued": self.queued_rows,
            "batch_size": self.batch,
            "prompt_tokens": t.prompt_tokens,
            "generation_tokens": t.generation_tokens,
            "prompt_tps": round(t.prompt_tokens / t.prompt_time, 2) if t.prompt_time else 0.0,
            "decode_tps": round(t.generation_tokens / t.decode_time, 2) if t.decode_time else 0.0,
            "requests_done": self.requests_done,
            "cancellations": self.cancellations,
            "engine_recoveries": self.recoveries,
            "memory_active_bytes": mx.get_active_memory(),
            "memory_peak_bytes": mx.get_peak_memory(),
            **(self.cache.stats() if self.cache else {}),
        }

    # -- the engine thread ----------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # never leave requests waiting on a dead thread
            log.exception("engine thread stopped")
            self.dead = f"{type(exc).__name__}: {exc}"
            self._fail_all(Unavailable(ENGINE_STOPPED))
            self._fail_queued()
        finally:
            self._stopped.set()

    def _fail_queued(self) -> None:
        try:
            while True:
                kind, sub = self._inbox.get_nowait()
                if kind == "submit":
                    self._admitted += 1
                    sub.sink(Event.failure(Unavailable(ENGINE_STOPPED)))
                elif kind == "persist":
                    sub.set()
                elif kind == "close_session":
                    sub[1].set()
        except queue.Empty:
            pass

    def _loop(self) -> None:
        # Streams belong to the thread that creates them: make ours here.
        self._stream = mx.new_stream(mx.default_device())
        self._gen = self._new_generator()
        self._eos = StopSequences([(t,) for t in self.m.eos_ids])
        stopping = False
        last_upkeep = time.monotonic()
        while True:
            stopping |= self._admit(block=not self._rows and not stopping)
            # Cache upkeep (write-behind, demotion) hands arrays to the SSD writer, which costs
            # the engine a synchronisation: do it when idle, or at most every 30 s under load.
            since = time.monotonic() - last_upkeep
            if self.cache is not None and (since >= 1.0 and not self._rows or since >= 30.0):
                last_upkeep = time.monotonic()
                try:
                    self.cache.maintain(last_upkeep)
                except Exception:  # the cache is an optimisation: never a reason to stop
                    log.exception("prompt-cache upkeep failed")
            if stopping and not self._rows:
                break
            if not self._rows:
                continue
            try:
                with self._gen.stats() as st:
                    prompt_responses, responses = self._gen.next()
            except Exception:  # the batch state is now unusable: rebuild it
                log.exception(
                    "engine step failed (rows %s)",
                    ", ".join(r.sub.rid for r in self._rows.values()),
                )
                self._recover()
                continue
            self._totals += st
            if not self.trimmable:
                try:
                    self._snapshot(prompt_responses)
                except Exception:  # a missed snapshot is a cache miss later, nothing more
                    log.exception("prompt-boundary snapshot failed")
            for sub, _ in self._broken:
                if (row := self._by_sub.get(id(sub))) is not None:
                    self._fail_row(row.uid, generation_failed(sub.rid))
            self._broken.clear()
            for r in responses:
                if r.uid not in self._rows:
                    continue  # failed just above
                try:
                    self._on_token(r)
                except Exception:  # one row's failure ends that row only
                    rid = self._rows[r.uid].sub.rid if r.uid in self._rows else r.uid
                    log.exception("row %s failed", rid)
                    self._fail_row(r.uid, generation_failed(str(rid)))
        self._gen.close()

    def _new_generator(self) -> BatchGenerator:
        return BatchGenerator(
            self.m.model,
            completion_batch_size=self.batch,
            prefill_batch_size=self.batch,
            prefill_step_size=self.prefill_step,
            stream=self._stream,
        )

    def _recover(self) -> None:
        """A step failed: start a fresh batch, fail the rows to blame, resume the others.

        A failed step leaves mlx-lm's batch half-updated (every later step fails with "eval
        an array without a primitive"), so nothing of it is kept: resumed rows prefill their
        prompt and the tokens already sent again. If even a fresh batch cannot be made, the
        exception stops the engine thread and /health reports the engine dead.
        """
        fail, resume = blame(list(self._rows.values()), self._broken)
        self._broken.clear()
        # Close first: a generator restores the wired-memory limit it found at creation, so the
        # new one must be made after the old one put the system's back.
        try:
            self._gen.close()
        except Exception:
            log.exception("closing the failed batch failed")
        self._gen = self._new_generator()
        self.recoveries += 1
        log.warning(
            "rebuilt the batch after a failed step: failing %s; resuming %s",
            [r.sub.rid for r in fail] or "none",
            [r.sub.rid for r in resume] or "none",
        )
        self._rows.clear()  # the old uids mean nothing to the new batch
        for row in fail:
            self._finish(row)
            row.sub.sink(Event.failure(generation_failed(row.sub.rid), row.generated))
        for row in resume:
            try:
                self._resume(row)
            except Exception:
                log.exception("resuming %s failed", row.sub.rid)
                self._finish(row)
                row.sub.sink(Event.failure(generation_failed(row.sub.rid), row.generated))

    def _resume(self, row: Row) -> None:
        """Put `row` into the fresh batch where it was: prompt plus the tokens already sent."""
        left = row.sub.params.max_tokens - row.generated
        row.uid = self._gen.insert_segments(
            [[list(row.sub.prompt) + row.tokens]],
            max_tokens=[max(1, left)],
            samplers=[row.sampler],
            logits_processors=[row.processors],
            stop_sequences=[self._eos],
        )[0]
        row.resumed = True
        self._rows[row.uid] = row

    def _admit(self, block: bool) -> bool:
        """Take everything waiting in the inbox. Returns True when asked to stop."""
        stop = False
        try:
            # Idle: wake up now and then for prompt-cache upkeep.
            item = self._inbox.get(timeout=1.0) if block else self._inbox.get_nowait()
            while True:
                kind, sub = item
                if kind == "submit":
                    self._admitted += 1
                    if self.closing:
                        sub.sink(Event.failure(Unavailable("This worker is draining")))
                    elif not sub.cancelled:
                        try:
                            self._insert(sub)
                        except Exception:  # a bad restore or an MLX error: this row only
                            log.exception("admitting %s failed", sub.rid)
                            sub.sink(Event.failure(generation_failed(sub.rid)))
                elif kind == "cancel":
                    self._drop(sub)
                elif kind == "persist":
                    if self.cache is not None:
                        self.cache.persist_all()
                    sub.set()
                elif kind == "close_session":
                    session, done = sub
                    if self.cache is not None:
                        self.cache.close_session(session)
                    done.set()
                else:
                    stop = True
                item = self._inbox.get_nowait()
        except queue.Empty:
            pass
        return stop

    def _insert(self, sub: Submission) -> None:
        p = sub.params
        sampler = make_row_sampler(p.temperature, p.top_p, p.top_k, p.min_p, p.seed)
        if sampler is not greedy_sampler:  # the shared greedy sampler runs once per batch
            sampler = guard_sampler(sub, sampler, self._broken)
        processors = make_row_processors(p) + [
            guard_processor(sub, f, self._broken) for f in sub.processors
        ]
        layers, n = None, 0
        if self.cache is not None:
            layers, n, _ = self.cache.fetch(sub.ns, sub.prompt, sub.restored)
            sub.restored = None  # let the arrays go
        sub.prompt_cached = n
        segments = [sub.prompt[n:]]
        if not self.trimmable and n < sub.boundary < len(sub.prompt):
            segments = [sub.prompt[n : sub.boundary], sub.prompt[sub.boundary :]]
        uid = self._gen.insert_segments(
            [segments],
            caches=[layers],
            all_tokens=[list(sub.prompt[:n])],
            max_tokens=[p.max_tokens],
            samplers=[sampler],
            logits_processors=[processors],
            stop_sequences=[self._eos],
        )[0]
        row = Row(
            sub=sub,
            uid=uid,
            text=TextStream(make_detokenizer(self.m.tokenizer), p.stop),
            sampler=sampler,
            processors=processors,
        )
        self._rows[uid] = row
        self._by_sub[id(sub)] = row

    def _drop(self, sub: Submission) -> None:
        row = self._by_sub.pop(id(sub), None)
        if row is None:
            return
        self._remove_keeping_cache(row)
        del self._rows[row.uid]
        self.cancellations += 1
        if sub.cancel_reason is not None:
            sub.sink(Event.failure(sub.cancel_reason, row.generated))

    def _finish(self, row: Row) -> None:
        self._rows.pop(row.uid, None)
        self._by_sub.pop(id(row.sub), None)
        self.requests_done += 1

    def _on_token(self, r) -> None:
        row = self._rows.get(r.uid)
        if row is None:
            return
        row.generated += 1
        row.tokens.append(r.token)
        finish = r.finish_reason
        logprobs = self._logprobs(row, r) if row.sub.params.logprobs else None
        if finish == "stop":  # only end-of-sequence tokens are token-level stops here
            text = row.text.finish()
        else:
            text = row.text.push(r.token)
            if row.text.stopped:
                self._remove_keeping_cache(row)
                finish = "stop"
            elif finish == "length":
                text += row.text.finish()
        if r.finish_reason is not None:
            self._store(row, r.all_tokens, r.prompt_cache)
        if finish is not None:
            self._finish(row)
        row.sub.sink(Event(text, row.generated, finish, logprobs))

    def _remove_keeping_cache(self, row: Row) -> None:
        """Take a row out of the batch; its prompt state goes to the cache on the way out."""
        if self.cache is None:
            self._gen.remove([row.uid])
            return
        for cache, tokens in self._gen.remove([row.uid], return_prompt_caches=True).values():
            self._store(row, tokens, cache)

    def _store(self, row: Row, tokens, layers) -> None:
        # A row cancelled before its prefill holds only what it was given from the cache.
        if self.cache is not None and layers and len(tokens) > row.sub.prompt_cached:
            self.cache.store(row.sub.ns, tuple(tokens), layers, row.sub.session)

    def _snapshot(self, prompt_responses) -> None:
        """Non-trimmable caches: keep the state at each prompt segment's end."""
        uids = [
            r.uid
            for r in prompt_responses
            if r.end_of_segment and not r.end_of_prompt and r.uid in self._rows
        ]
        if not uids or self.cache is None:
            return
        for uid, (cache, tokens) in self._gen.extract_cache(uids).items():
            self._store(self._rows[uid], tokens, cache)

    def _logprobs(self, row: Row, r) -> list[dict]:
        return [logprob_entry(r.logprobs, r.token, row.sub.params.top_logprobs)]

    def _fail_row(self, uid: int, err: MlxdError) -> None:
        row = self._rows.get(uid)
        if row is None:
            return
        try:
            self._gen.remove([uid])
        except Exception:
            log.exception("removing row %s failed", uid)
        self._finish(row)
        row.sub.sink(Event.failure(err, row.generated))

    def _fail_all(self, err: MlxdError) -> None:
        rows = list(self._rows.values())
        if rows and hasattr(self, "_gen"):
            try:
                self._gen.remove([row.uid for row in rows])
            except Exception:
                log.exception("clearing the batch failed")
        for row in rows:
            self._finish(row)
            try:
                row.sub.sink(Event.failure(err))
            except RuntimeError:  # the event loop is already closed: nobody is waiting
                pass
