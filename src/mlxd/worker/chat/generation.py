"""The asyncio side of one request: submit to the engine, await its events, cancel on exit."""

from __future__ import annotations

import asyncio
import threading
import time
import weakref

from mlxd.shared.params import GenerationParams
from mlxd.worker.cache.keys import CacheKey
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.rows import Event, Submission
from mlxd.worker.vision.prompt import VisionInput


class Handoff:
    """Engine thread to event loop: events wait under a lock, and the loop is woken once for
    all the events of a step (a wake-up is a syscall; one per token per row added up)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue, Event]] = []

    def send(self, queue: asyncio.Queue, ev: Event) -> None:
        """Any thread; raises RuntimeError once the loop is closed (nobody is waiting)."""
        with self._lock:
            self._pending.append((queue, ev))
            if len(self._pending) > 1:  # a wake-up is already on its way
                return
        self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            items, self._pending = self._pending, []
        for queue, ev in items:
            queue.put_nowait(ev)


_handoffs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Handoff] = (
    weakref.WeakKeyDictionary()
)


def handoff_for(loop: asyncio.AbstractEventLoop) -> Handoff:
    """The loop's one Handoff (made on first use)."""
    h = _handoffs.get(loop)
    if h is None:
        h = _handoffs[loop] = Handoff(loop)
    return h


class Generation:
    """Async iterator over a request's engine events.

    Leaving it early (client gone, handler cancelled) cancels the row, which leaves the batch
    at the engine's next step.
    """

    def __init__(
        self,
        engine: Engine,
        rid: str,
        prompt: list[int],
        params: GenerationParams,
        processors: list | None = None,
        cache_key: CacheKey | None = None,
        adapter: str | None = None,
        images: VisionInput | None = None,
    ):
        self._engine = engine
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        handoff, queue = handoff_for(asyncio.get_running_loop()), self._queue
        self._sub = Submission(
            rid=rid,
            prompt=prompt,
            params=params,
            sink=lambda ev: handoff.send(queue, ev),
            processors=processors or [],
            adapter=adapter,
            images=images,
        )
        if cache_key is not None:
            self._sub.ns = cache_key.ns
            self._sub.session = cache_key.session
            self._sub.boundary = cache_key.boundary
            self._sub.restored = cache_key.restored
            self._sub.replies = cache_key.replies
        self.done = False
        self.prompt_tokens = len(prompt)
        # Test-only slow prefill (settings: debug_prefill_delay_s): the first event waits.
        delay_s = getattr(engine, "debug_prefill_delay_s", 0.0)
        self._hold_until = time.monotonic() + delay_s if delay_s else None

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from the prompt cache (known once the first event arrived)."""
        return self._sub.prompt_cached

    @property
    def prompt_done(self) -> int:
        """Prompt tokens processed so far: cached plus prefilled (the engine thread's count)."""
        return self._sub.prompt_done

    def __enter__(self) -> Generation:
        self._engine.submit(self._sub)
        return self

    def __exit__(self, *exc) -> None:
        if not self.done:
            self._engine.cancel(self._sub)

    async def next(self, timeout_s: float | None = None) -> Event | None:
        """The next event, or None when `timeout_s` passes first (time for a keep-alive)."""
        if self._hold_until is not None:
            left_s = self._hold_until - time.monotonic()
            if left_s > 0:
                if timeout_s is not None and timeout_s <= left_s:
                    await asyncio.sleep(timeout_s)
                    return None
                await asyncio.sleep(left_s)
                if timeout_s is not None:  # the caller's keep-alive ticks keep their pace
                    timeout_s -= left_s
            self._hold_until = None
        if not self._queue.empty():  # the common case while streaming: no wait, no timer
            ev = self._queue.get_nowait()
        elif timeout_s is None:
            ev = await self._queue.get()
        else:
            # Not asyncio.wait_for: before 3.12 it swallows a cancel (the client left) that
            # lands as an event arrives, and the row then generates to its end for nobody.
            get = asyncio.ensure_future(self._queue.get())
            try:
                done, _ = await asyncio.wait((get,), timeout=timeout_s)
            finally:
                if not get.done():
                    get.cancel()  # an event it did not take stays in the queue
            if not done:
                return None
            ev = get.result()
        if ev.finish_reason is not None:
            self.done = True
        return ev

    async def collect(self) -> tuple[str, Event, list[dict]]:
        """Wait for the whole completion: (text, last event, logprob entries)."""
        parts: list[str] = []
        logprobs: list[dict] = []
        while True:
            ev = await self.next()
            assert ev is not None  # without a timeout, next() waits for an event
            parts.append(ev.text)
            if ev.logprobs:
                logprobs.extend(ev.logprobs)
            if ev.finish_reason is not None:
                return "".join(parts), ev, logprobs
