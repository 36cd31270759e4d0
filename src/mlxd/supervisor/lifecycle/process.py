"""One worker process: spawn / terminate / kill / reap, and the tail of its log.

A fresh interpreter every time (never fork a process that may have touched MLX), unbuffered
(-u) so each line reaches the pipe as it is written. Its output goes to
$MLXD_HOME/logs/<id>.log, and the last lines stay in memory so a failure can say why.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

import psutil

from mlxd.shared.exit_codes import MEANING

log = logging.getLogger("mlxd.child")


class WorkerProcess:
    """A wrapper around one spawned worker."""

    def __init__(self, model_id: str, argv: list[str], log_path: Path, tail_lines: int = 40):
        self.model_id = model_id
        self.argv = argv
        self.log_path = log_path
        self.tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.proc: asyncio.subprocess.Process | None = None
        # What runs `argv`: a fresh interpreter here (a worker group's remote rank: ssh).
        self.command = [sys.executable, "-u", "-m"]
        self._pump: asyncio.Task | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc else None

    def exited(self) -> bool:
        """True once the process has ended, even before asyncio has reaped it: a worker killed
        a moment ago is a zombie whose returncode is still None."""
        pid = self.pid
        if pid is None or self.returncode is not None:
            return True
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.Error:  # gone (or not ours to read): it cannot take a request
            return True

    async def spawn(self, env: Mapping[str, str] | None = None) -> None:
        """Start the worker. `env` is its whole environment (None: the supervisor's own);
        everything it needs to know comes in its argv (a WorkerSpec)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = await asyncio.create_subprocess_exec(
            *self.command,
            "mlxd.worker",
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=None if env is None else dict(env),
            start_new_session=True,  # a Ctrl-C at the terminal reaches the supervisor only
        )
        self._pump = asyncio.create_task(self._copy_output())
        log.info("spawned model=%s pid=%d", self.model_id, self.proc.pid)

    async def _copy_output(self) -> None:
        assert self.proc and self.proc.stdout
        with open(self.log_path, "ab", buffering=0) as out:
            async for line in self.proc.stdout:
                out.write(line)
                self.tail.append(line.decode(errors="replace").rstrip())

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        if self.proc and self.proc.returncode is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    async def reap(self) -> int:
        """Wait for the exit; returns the exit code (negative: killed by that signal)."""
        assert self.proc
        code = await self.proc.wait()
        if self._pump:
            try:
                await asyncio.wait_for(self._pump, 2.0)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                pass
        return code

    async def stop(self, timeout_s: float) -> int:
        """Two-phase stop: SIGTERM, wait up to `timeout_s`, then SIGKILL."""
        proc = self.proc
        assert proc is not None, "stop() before spawn()"
        self.terminate()
        try:
            return await asyncio.wait_for(asyncio.shield(proc.wait()), timeout_s)
        except asyncio.TimeoutError:
            log.warning(
                "model=%s pid=%s ignored SIGTERM for %.0fs: SIGKILL",
                self.model_id,
                self.pid,
                timeout_s,
            )
            self.kill()
            return await proc.wait()

    def exit_summary(self) -> str:
        """How the worker ended, without its log lines (safe to tell an API client)."""
        code = self.returncode
        if code is not None and code < 0:
            return f"killed by {signal.Signals(-code).name}"
        meaning = MEANING.get(code, "it failed") if code is not None else "it failed"
        return f"exit code {code}: {meaning}"

    def describe_exit(self) -> str:
        code = self.returncode
        how = (
            f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
        )
        tail = " | ".join(list(self.tail)[-5:])
        return f"{how}; last log lines: {tail}" if tail else how
