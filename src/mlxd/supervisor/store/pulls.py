"""The daemon's pulls: one per model at a time, each in its own thread (store/puller.py), its
progress fanned out to every client following it.

A second request for a model being pulled joins the pull under way (it is shown the progress
so far, then the rest). A pull is cancelled when the last client following it leaves (Ollama's
clients cancel by closing the request); the bytes it got stay for the next pull to go on from.
At most MAX_PULLS run at once (429 beyond).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from mlxd.shared.errors import BadGateway, MlxdError, TooManyRequests
from mlxd.shared.wire.ollama_manage import ProgressLine
from mlxd.supervisor.store import puller
from mlxd.supervisor.store.folders import write_error
from mlxd.supervisor.store.hub import Cancelled, Hub
from mlxd.supervisor.store.names import PullTarget
from mlxd.supervisor.store.progress import add_to_backlog

log = logging.getLogger("mlxd.pull")

MAX_PULLS = 4
END = None  # the queue item after a pull's last line


class Pull:
    """One model's pull: its lines so far, the queues of the clients following it."""

    def __init__(self, target: PullTarget):
        self.target = target
        self.backlog: list[ProgressLine] = []
        self.followers: set[asyncio.Queue] = set()
        self.cancel = threading.Event()
        loop = asyncio.get_running_loop()
        self.ready: asyncio.Future = loop.create_future()  # the files are known, disk checked
        self.done: asyncio.Future = loop.create_future()  # the folder, or the failure

    def follow(self) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        for line in self.backlog:
            q.put_nowait(line)
        if self.done.done():
            q.put_nowait(self.done.exception() or END)
        self.followers.add(q)
        return q

    def leave(self, q: asyncio.Queue) -> None:
        """A client stopped following; the last one to leave cancels the pull."""
        self.followers.discard(q)
        if not self.followers and not self.done.done() and not self.cancel.is_set():
            log.info("pull of model=%s cancelled: no client follows it", self.target.model_id)
            self.cancel.set()

    def publish(self, line: ProgressLine) -> None:
        add_to_backlog(self.backlog, line)
        for q in self.followers:
            q.put_nowait(line)

    def set_ready(self) -> None:
        if not self.ready.done():
            self.ready.set_result(None)

    def finish(self, folder: Path | None, error: BaseException | None) -> None:
        if error is not None and not isinstance(error, MlxdError):
            error = MlxdError(str(error))  # Cancelled: no client is left to read it
        for fut in (self.ready, self.done):
            if not fut.done():
                if error is None:
                    fut.set_result(folder)
                else:
                    fut.set_exception(error)
                    fut.exception()  # read: a failure nobody awaited is not an error
        for q in self.followers:
            q.put_nowait(error or END)


class Pulls:
    """Every pull under way in this daemon, by model id. `run` is puller.pull (tests pass a
    fake); `on_done(model_id)` runs on the loop after a pull that succeeded."""

    def __init__(
        self,
        models_dir: Path,
        hub: Hub,
        *,
        run: Callable[..., Path] = puller.pull,
        on_done: Callable[[str], None] = lambda model_id: None,
        max_pulls: int = MAX_PULLS,
    ):
        self.models_dir = models_dir
        self.hub = hub
        self.run = run
        self.on_done = on_done
        self.max_pulls = max_pulls
        self.active: dict[str, Pull] = {}

    async def follow(self, target: PullTarget) -> tuple[Pull, asyncio.Queue]:
        """Start or join `target`'s pull; returns it with a queue of its lines once its files
        are known and the disk has room (a failure before that raises here, as the request's)."""
        pull = self.active.get(target.model_id)
        if pull is not None and pull.cancel.is_set():  # a cancelled one is still stopping
            await asyncio.wait([pull.done])
            pull = self.active.get(target.model_id)
        if pull is None:
            if len(self.active) >= self.max_pulls:
                raise TooManyRequests(f"at most {self.max_pulls} downloads run at once")
            pull = self.active[target.model_id] = Pull(target)
            threading.Thread(
                target=self._run, args=(pull, asyncio.get_running_loop()), daemon=True
            ).start()
        q = pull.follow()
        try:
            await asyncio.shield(pull.ready)
        except BaseException:
            pull.leave(q)
            raise
        return pull, q

    def _run(self, pull: Pull, loop: asyncio.AbstractEventLoop) -> None:
        def call(fn, *args) -> None:
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:  # the loop closed: the daemon is gone
                pass

        try:
            folder = self.run(
                pull.target,
                self.models_dir,
                self.hub,
                emit=lambda line: call(pull.publish, line),
                cancelled=pull.cancel.is_set,
                on_ready=lambda: call(pull.set_ready),
            )
        except Cancelled as exc:
            call(self._finish, pull, None, exc)
        except MlxdError as exc:
            log.info("pull of model=%s failed: %s", pull.target.model_id, exc.message)
            call(self._finish, pull, None, exc)
        except OSError as exc:  # the models folder could not be written
            log.exception("pull of model=%s failed", pull.target.model_id)
            call(self._finish, pull, None, write_error(exc, f"'{pull.target.model_id}'"))
        except Exception as exc:
            log.exception("pull of model=%s failed", pull.target.model_id)
            failed = BadGateway(f"the download failed: {type(exc).__name__}")
            call(self._finish, pull, None, failed)
        else:
            call(self._finish, pull, folder, None)

    def _finish(self, pull: Pull, folder: Path | None, error: BaseException | None) -> None:
        if self.active.get(pull.target.model_id) is pull:
            del self.active[pull.target.model_id]
        pull.finish(folder, error)
        if error is None:
            self.on_done(pull.target.model_id)

    def cancel_all(self) -> None:
        """The daemon is stopping: every pull stops at its next chunk (its bytes stay)."""
        for pull in self.active.values():
            pull.cancel.set()
