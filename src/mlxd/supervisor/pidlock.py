"""One daemon per home: an exclusive lock on `$MLXD_HOME/run/mlxd.pid`, held for the daemon's life.

Two daemons on one home would share worker sockets, and the second's shutdown would drain the
first's workers. The lock is `flock` on a descriptor kept open until exit, so the kernel drops it
when the daemon dies however it dies: a pid file left by a crash is simply taken over.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

PID_FILE = "mlxd.pid"


class HomeLocked(Exception):
    """Another live daemon holds this home's lock. `pid` is its pid when it could be read."""

    def __init__(self, home: Path, pid: int | None):
        self.home = home
        self.pid = pid
        who = f"pid {pid}" if pid else "another process"
        super().__init__(
            f"another mlxd ({who}) is already running with home {home}; "
            "stop it first or start with a different --home"
        )


class PidLock:
    """The held lock; `release()` (or process exit) gives it up."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, run_dir: Path, home: Path) -> PidLock:
        """Take the lock without waiting and write our pid, or raise HomeLocked."""
        path = run_dir / PID_FILE
        # O_NOFOLLOW: run/ is ours, but never let a planted link aim the truncate elsewhere.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise HomeLocked(home, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Empty the pid file and drop the lock.

        The file is emptied, not unlinked: unlinking a locked file lets a daemon that opened the
        old file and one that creates a new one both believe they hold the lock.
        """
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)  # closing the last descriptor drops the flock


def _read_pid(fd: int) -> int | None:
    # The holder writes its pid right after it locks; give a racing start a moment to finish.
    for _ in range(5):
        raw = os.pread(fd, 32, 0).strip()
        if raw:
            try:
                return int(raw)
            except ValueError:
                return None
        time.sleep(0.02)
    return None
