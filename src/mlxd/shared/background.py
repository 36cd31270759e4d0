"""Background tasks the supervisor starts and cancels at shutdown (reapers, unloads, imports)."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any

from mlxd.shared.errors import Unavailable


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


async def outlive_client(task: asyncio.Task, what: str) -> Any:
    """`task`'s result, for a request that started it in the background so that its client
    leaving does not stop it. When shutdown cancels `task` (cancel_all) while the request
    itself still runs, the request gets a 503 saying so, not a connection closed with no
    answer; a request cancelled itself (its client left) is cancelled as before."""
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        # Task.cancelling() is Python 3.11's; before it, a shutdown's cancel is assumed.
        cancelling = getattr(asyncio.current_task(), "cancelling", lambda: 0)
        if task.cancelled() and not cancelling():
            raise Unavailable(f"{what} did not finish: mlxd is shutting down") from None
        raise
