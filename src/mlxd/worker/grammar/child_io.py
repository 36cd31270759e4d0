"""The worker's side of the wire to a grammar compile child (compile_child.py, which defines
the length-prefixed frames): what the worker watches while a child runs (its answer, its
memory, its end)."""

from __future__ import annotations

import asyncio
import contextlib

import orjson
import psutil

from mlxd.worker.grammar.compile_child import FRAME

WATCH_S = 0.05  # how often a child's resident memory is read


async def read_answer(proc) -> tuple[dict, bytes | None] | None:
    """The child's header and Index frames; None if it died first."""
    try:
        header = orjson.loads(await _frame(proc.stdout))
        blob = await _frame(proc.stdout) if header.get("ok") else None
    except (asyncio.IncompleteReadError, orjson.JSONDecodeError):
        return None
    return header, blob


async def _frame(stream: asyncio.StreamReader) -> bytes:
    (n,) = FRAME.unpack(await stream.readexactly(FRAME.size))
    return await stream.readexactly(n)


async def watch_memory(proc, limit_bytes: int) -> None:
    """Return (the caller kills the child) once its resident memory passes the limit: the
    bound where RLIMIT_AS is not enforced (macOS)."""
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(proc.pid)
        base = p.memory_info().rss
        while True:
            await asyncio.sleep(WATCH_S)
            if p.memory_info().rss - base > limit_bytes:
                return
    await asyncio.Event().wait()  # the child is gone: the answer (or its absence) decides


def kill(proc) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
