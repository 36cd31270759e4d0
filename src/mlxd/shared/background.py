"""Background tasks the supervisor starts and cancels at shutdown (reapers, unloads, imports)."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine


class Background:
    """Tasks that outlive the request or event that started them; cancelled at shutdown."""

    def __init__(self):
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine, *, inherit_context: bool = False) -> asyncio.Task:
        """Run `coro` in the background. By default its log lines do not carry the request id
        of whoever started it (see shared/logs.py): the work is not that request's."""
        ctx = contextvars.copy_context() if inherit_context else contextvars.Context()
        task = ctx.run(asyncio.create_task, coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
