"""A GGUF file imported as a model folder by `python -m mlxd.worker.importers.gguf` in a child
process (it needs MLX; the supervisor never imports it): the built-in model's first start and
Ollama's /api/create from a GGUF file."""

from __future__ import annotations

import asyncio
import collections
import sys
from collections.abc import Callable
from pathlib import Path

TAIL_LINES = 3


async def run_import(
    gguf: Path, models_dir: Path, model_id: str, on_line: Callable[[str], None]
) -> tuple[int, list[str]]:
    """Import `gguf` as models_dir/<model_id>/, handing each output line to `on_line` (a
    tenth of the tensors at a time); returns the exit code and the last lines (on failure,
    the last is `error: …`). A cancelled import kills its child."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mlxd.worker.importers.gguf",
        str(gguf),
        "--models-dir",
        str(models_dir),
        "--id",
        model_id,
        "--progress",
        "lines",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert proc.stdout is not None
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    try:
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").strip()
            if line:
                tail.append(line)
                on_line(line)
        await proc.wait()
    except asyncio.CancelledError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, list(tail)
