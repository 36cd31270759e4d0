"""The one thread that owns a speech model's MLX objects, and the queue in front of it.

Requests are queued, first come first served, and transcribed one at a time: a Whisper
`generate` call decodes its windows in sequence and mlx-audio has no batched form of it, so
several at once would only share the same cores. A request whose client left before its turn
is skipped; one already running finishes (the library has no point to stop it at).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlxd.shared.errors import MlxdError, Unavailable

log = logging.getLogger("mlxd.worker.speech")

MAX_QUEUED = 32  # transcriptions waiting behind the running one; more are a 503
FAILED = "The transcription failed; the worker log has the details"


@dataclass
class _Job:
    work: Callable[[], Any]
    done: asyncio.Future
    loop: asyncio.AbstractEventLoop


class SpeechRunner:
    """Runs submitted work on its own thread, one at a time; counts what it did."""

    def __init__(self) -> None:
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="mlxd-speech", daemon=True)
        self.running = 0  # 1 while a transcription runs
        self.completed = 0
        self.failed = 0
        self.audio_s = 0.0  # seconds of audio transcribed
        self.dead: str | None = None

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish what is queued, then end the thread."""
        self._queue.put(None)

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    async def submit(self, work: Callable[[], Any], audio_s: float = 0.0) -> Any:
        """Run `work` on the speech thread; its result, or its error as an MlxdError."""
        if self.dead is not None:
            raise Unavailable(f"The speech thread stopped: {self.dead}")
        if self._queue.qsize() >= MAX_QUEUED:
            raise Unavailable(
                f"{MAX_QUEUED} transcriptions are already waiting for this model; retry later",
                retry_after_s=5,
            )
        loop = asyncio.get_running_loop()
        job = _Job(work, loop.create_future(), loop)
        self._queue.put(job)
        result = await job.done
        self.audio_s += audio_s
        return result

    def _run(self) -> None:
        stream = mx.new_stream(mx.default_device())  # streams belong to their thread
        try:
            while (job := self._queue.get()) is not None:
                if job.done.cancelled():  # its client left while it waited
                    continue
                self.running = 1
                try:
                    with mx.stream(stream):
                        result = job.work()
                except MlxdError as err:
                    self._settle(job, err)
                except Exception as exc:
                    log.exception("transcription failed")
                    self.failed += 1
                    memory = "memory" in str(exc).lower()
                    self._settle(job, Unavailable("Out of memory") if memory else MlxdError(FAILED))
                else:
                    self.completed += 1
                    self._settle(job, None, result)
                finally:
                    self.running = 0
                    mx.clear_cache()  # windows of many shapes: give the buffers back
        except BaseException as exc:  # never leave requests waiting on a dead thread
            self.dead = f"{type(exc).__name__}: {exc}"
            log.exception("speech thread stopped")
            while not self._queue.empty():
                if (left := self._queue.get_nowait()) is not None:
                    self._settle(left, Unavailable(f"The speech thread stopped: {self.dead}"))

    @staticmethod
    def _settle(job: _Job, err: MlxdError | None, result: Any = None) -> None:
        def settle() -> None:
            if job.done.done():
                return
            if err is None:
                job.done.set_result(result)
            else:
                job.done.set_exception(err)

        job.loop.call_soon_threadsafe(settle)
