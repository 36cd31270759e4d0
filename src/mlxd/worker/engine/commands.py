"""What other threads ask of the engine: each request becomes a typed command in the engine
thread's inbox (sched/inbox.py), which the engine thread takes between steps (`_handle`, here).
Any thread may call these; only the engine thread touches the batch. The Engine (loop.py) is an
EngineCommands; once its thread is gone, whoever puts a command answers it here, so no
request waits on a dead thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from mlxd.shared.errors import MlxdError, Unavailable
from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.engine.batch import Batch
from mlxd.worker.engine.call import EngineCall
from mlxd.worker.engine.rows import Event, Submission
from mlxd.worker.engine.sched.inbox import (
    Cancel,
    CloseSession,
    Command,
    Inbox,
    Job,
    PersistCache,
    RunJob,
    Stop,
    Submit,
)
from mlxd.worker.engine.sched.schedule import Scheduler

# Clients hear this; why the thread stopped is in the log and in /health (`dead`).
ENGINE_STOPPED = "The engine of this worker stopped; the worker log has the details"


class EngineCommands:
    """The engine's verbs for other threads (the state they read is the engine thread's)."""

    _batch: Batch
    _sched: Scheduler
    _inbox: Inbox
    _thread: threading.Thread
    _gone: bool
    dead: str | None
    closing: bool
    cache: PromptCache | None
    _stopping: bool
    _stream: mx.Stream

    def submit(self, sub: Submission) -> None:
        """Queue `sub`; raises PayloadTooLarge (413, before any work) for a row that could
        never fit the KV budget."""
        if self.dead is not None:
            sub.sink(Event.failure(Unavailable(ENGINE_STOPPED)))
            return
        self._sched.check(sub)
        self._put(Submit(sub))

    def cancel(self, sub: Submission, reason: MlxdError | None = None) -> None:
        """Drop `sub`'s row at the next step; with a `reason`, its request hears why."""
        sub.cancelled = True
        sub.cancel_reason = reason
        self._put(Cancel(sub))

    def _put(self, cmd: Command) -> None:
        """Queue `cmd` for the engine thread; once that thread is gone, answer it here.

        The thread marks itself gone before its last look at the inbox, so a command put
        before that look is answered there, and one put after it sees the mark: none is lost.
        """
        self._inbox.put(cmd)
        if self._gone:
            self._answer_leftovers()

    def cancel_all(self) -> int:
        """Cancel every row still running or queued (a drain deadline passed)."""
        self.closing = True  # submissions still on their way get refused, not admitted
        subs = [row.sub for row in list(self._batch.rows.values())] + list(self._sched.waiting)
        for sub in subs:
            self.cancel(sub, Unavailable("The model is being unloaded; this request was cancelled"))
        return len(subs)

    def persist_cache(self) -> threading.Event:
        """Queue every RAM cache entry for the SSD tier; the event is set once queued."""
        done = threading.Event()
        self._put(PersistCache(done))
        return done

    def close_session(self, session: str) -> threading.Event:
        """Forget `session`'s prompt-cache entries; the event is set once they are gone."""
        done = threading.Event()
        self._put(CloseSession(session, done))
        return done

    def run_job(self, job: Job) -> None:
        """Run `job` (one embedding forward) on the engine thread between two steps."""
        if self.dead is not None:
            job.fail(Unavailable(ENGINE_STOPPED))
            return
        self._put(RunJob(job))

    async def call(self, fn: Callable[[], Any], what: str) -> Any:
        """`fn()` run on the engine thread between steps: its result, or its error raised
        (an MlxdError; Unavailable once the engine stopped or drains). `what` names it in
        the log when it fails."""
        job = EngineCall(fn, what)
        self.run_job(job)
        return await job.done

    def stop(self) -> None:
        """Ask the thread to exit once in-flight rows are done or cancelled."""
        self._put(Stop())

    def join(self, timeout_s: float | None = None) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _answer_leftovers(self) -> None:
        """The thread is gone: answer every command still in the inbox (any thread; the
        queue hands each command to one taker only)."""
        for cmd in self._inbox.take(block=False):
            try:
                if isinstance(cmd, Submit):
                    cmd.sub.sink(Event.failure(Unavailable(ENGINE_STOPPED)))
                elif isinstance(cmd, PersistCache | CloseSession):
                    cmd.done.set()
                elif isinstance(cmd, RunJob):
                    cmd.job.fail(Unavailable(ENGINE_STOPPED))
            except RuntimeError:  # the event loop is already closed: nobody is waiting
                pass

    def _handle(self, cmd: Command) -> None:
        """Dispatch one inbox command (on the engine thread, between steps)."""
        match cmd:
            case Submit(sub):
                if self.closing:
                    sub.sink(Event.failure(Unavailable("This worker is draining")))
                elif sub.cancelled:  # its client left first: counted here, its Cancel finds none
                    self._batch.cancellations += 1
                    if sub.cancel_reason is not None:
                        sub.sink(Event.failure(sub.cancel_reason))
                else:
                    self._sched.add(sub)
            case Cancel(sub):
                if not self._sched.cancel(sub):
                    self._batch.drop(sub)
            case PersistCache(done):
                if self.cache is not None:
                    self.cache.writes.persist_all()
                done.set()
            case CloseSession(session, done):
                if self.cache is not None:
                    self.cache.close_session(session)
                done.set()
            case Stop():
                self._stopping = True
            case RunJob(job):
                if self.closing:
                    job.fail(Unavailable("This worker is draining"))
                else:
                    job.run(self._stream)
