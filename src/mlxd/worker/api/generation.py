"""The asyncio side of one request: submit to the engine, await its events, cancel on exit."""

from __future__ import annotations

import asyncio
import time

from mlxd.shared.params import GenerationParams
from mlxd.worker.cache.keys import CacheKey
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.rows import Event, Submission


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
    ):
        self._engine = engine
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self._sub = Submission(
            rid=rid,
            prompt=prompt,
            params=params,
            sink=lambda ev: loop.call_soon_threadsafe(self._queue.put_nowait, ev),
            processors=processors or [],
        )
        if cache_key is not None:
            self._sub.ns = cache_key.ns
            self._sub.session = cache_key.session
            self._sub.boundary = cache_key.boundary
            self._sub.restored = cache_key.restored
        self.done = False
        self.prompt_tokens = len(prompt)
        # Test-only slow prefill (settings: debug_prefill_delay_s): the first event waits.
        delay_s = getattr(engine, "debug_prefill_delay_s", 0.0)
        self._hold_until = time.monotonic() + delay_s if delay_s else None

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from the prompt cache (known once the first event arrived)."""
        return self._sub.prompt_cached

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
        try:
            ev = await asyncio.wait_for(self._queue.get(), timeout_s)
        except asyncio.TimeoutError:
            return None
        if ev.finish_reason is not None:
            self.done = True
        return ev

    async def collect(self) -> tuple[str, Event, list[dict]]:
        """Wait for the whole completion: (text, last event, logprob entries)."""
        parts: list[str] = []
        logprobs: list[dict] = []
        while True:
            ev = await self.next()
            parts.append(ev.text)
            if ev.logprobs:
                logprobs.extend(ev.logprobs)
            if ev.finish_reason is not None:
                return "".join(parts), ev, logprobs
