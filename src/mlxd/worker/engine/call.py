"""A function run on the engine thread between steps (the owner of every MLX array), its
result handed back to the event loop that asked (`Engine.call`, commands.py): an adapter's
mount or unmount (api/adapters.py), an SSD entry read ahead into RAM (cache/read_ahead.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from mlxd.shared.errors import MlxdError

log = logging.getLogger("mlxd.worker")


class EngineCall:
    """Runs `fn()` on the engine thread (engine.run_job); `await call.done` gives its result or
    raises its error (an MlxdError, which the error middleware turns into its status).
    `what` names it in the log when it fails."""

    def __init__(self, fn: Callable[[], Any], what: str):
        self._fn, self._what = fn, what
        self._loop = asyncio.get_running_loop()
        self.done: asyncio.Future[Any] = self._loop.create_future()

    def run(self, stream) -> None:
        try:
            with mx.stream(stream):
                value = self._fn()
        except MlxdError as exc:
            self._loop.call_soon_threadsafe(self._settle, None, exc)
        except Exception as exc:  # noqa: BLE001 - its failure is its caller's
            log.exception("%s failed", self._what)
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
