"""What every worker app does around its model: bind the socket (mode 0600), turn SIGTERM,
SIGINT and a parent's death into one stop event, and remove the socket at the end."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from aiohttp import web

from mlxd.shared.lifeline import watch_parent
from mlxd.shared.worker_spec import WorkerSpec


async def open_socket(app: web.Application, sock: Path) -> web.AppRunner:
    """Serve `app` on the UNIX socket `sock` (a stale one from a crashed worker is replaced)."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    sock.parent.mkdir(parents=True, exist_ok=True)
    if sock.exists() or sock.is_symlink():
        sock.unlink()
    old_umask = os.umask(0o177)  # the socket is created 0600
    try:
        await web.UnixSite(runner, str(sock)).start()
    finally:
        os.umask(old_umask)
    return runner


def stop_events(cfg: WorkerSpec) -> tuple[asyncio.Event, asyncio.Event]:
    """(stop, parent_gone): stop is set by SIGTERM, SIGINT or the parent's death."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    parent_gone = asyncio.Event()
    if cfg.exit_with_parent:
        asyncio.create_task(watch_parent(parent_gone.set))
        asyncio.create_task(_set_when(parent_gone, stop))
    return stop, parent_gone


async def _set_when(trigger: asyncio.Event, target: asyncio.Event) -> None:
    await trigger.wait()
    target.set()


def unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
