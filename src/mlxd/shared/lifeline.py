"""A worker never outlives its supervisor."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
import threading
import time

# The parent this process started under, read when the module is first imported (the worker's
# entry point imports it before anything heavy): a parent that dies in the second or so before
# a lifeline is armed is still noticed, instead of init being taken for the parent.
PARENT_AT_START = os.getppid()


def die_with_parent() -> None:
    """Linux: have the kernel send SIGTERM when the parent exits (PR_SET_PDEATHSIG); a parent
    already gone by then gets the same SIGTERM at once (the kernel would not send it)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != PARENT_AT_START:
        os.kill(os.getpid(), signal.SIGTERM)


async def watch_parent(on_gone, interval_s: float = 0.5) -> None:
    """Everywhere: when we are re-parented, the supervisor is gone."""
    parent = PARENT_AT_START
    while True:
        await asyncio.sleep(interval_s)
        if os.getppid() != parent:
            on_gone()
            return


def exit_when_orphaned(code: int, interval_s: float = 0.5) -> None:
    """A thread that ends the process once it is re-parented, whatever its main thread is
    doing: a follower rank can be blocked in a collective whose peer is gone, and one on
    another host (started through ssh) has no parent-death signal on macOS; its ssh session
    ending re-parents it."""
    parent = PARENT_AT_START

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        os._exit(code)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()
