"""A mount or unmount, run on the engine thread between steps (the owner of every MLX array),
its result handed back to the event loop that asked."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from mlxd.shared.errors import MlxdError

log = logging.getLogger("mlxd.worker.lora")


class AdapterJob:
    """Runs `fn()` on the engine thread; `await job.done` gives its result or raises its
    error (an MlxdError, which the error middleware turns into its status)."""

    def __init__(self, fn: Callable[[], Any]):
        self._fn = fn
        self._loop = asyncio.get_running_loop()
        self.done: asyncio.Future[Any] = self._loop.create_future()

    def run(self, stream) -> None:
        try:
            with mx.stream(stream):
                value = self._fn()
        except MlxdError as exc:
            self._loop.call_soon_threadsafe(self._settle, None, exc)
        except Exception as exc:  # noqa: BLE001 - an adapter's failure is that request's
            log.exception("adapter job failed")
            self._loop.call_soon_threadsafe(self._settle, None, MlxdError(str(exc)))
        else:
            self._loop.call_soon_threadsafe(self._settle, value, None)

    def fail(self, err: MlxdError | None) -> None:
        self._loop.call_soon_threadsafe(self._settle, None, err or MlxdError("engine stopped"))

    def _settle(self, value: Any, err: MlxdError | None) -> None:
        if self.done.done():
            return
        if err is not None:
            self.done.set_exception(err)
        else:
            self.done.set_result(value)
