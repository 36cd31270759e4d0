"""Between the servers' turns in a run: the whole device for the one whose turn it is
(`exclusive`), and a server that failed a request said once in a figure's note."""

from __future__ import annotations

import asyncio

import aiohttp

from .client import BenchError, Target
from .context import Context, Figure, _one

# What a server that cannot serve a request raises here: an error answer, a broken
# connection, a timeout.
SERVER_FAILED = (BenchError, aiohttp.ClientError, asyncio.TimeoutError)


def failed(fig: Figure, t: Target, exc: Exception) -> None:
    """A server that failed a request (a baseline out of memory, ...): said once in the
    figure's note, and the run goes on with the figures it can still measure."""
    said = f"{t.name} failed ("
    if said not in fig.note:
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        fig.note += f"{said}{why}). "


async def hold_device(ctx: Context, t: Target) -> None:
    """With `exclusive`, give `t` the whole device: before mlx_lm.server's turn unload mlxd's
    model (and start mlx_lm.server again if it was stopped); before mlxd's, stop mlx_lm.server
    (where the context can: its model, prompt cache and buffers otherwise stay on the device)
    and load mlxd's model again (untimed, with a short request)."""
    if not ctx.sizes.exclusive or ctx.unload_mlxd is None:
        return
    if t is ctx.mlx_lm:
        await ctx.unload_mlxd()
        if ctx.ensure_mlx_lm is not None:
            await ctx.ensure_mlx_lm()
    else:
        if ctx.stop_mlx_lm is not None:
            await ctx.stop_mlx_lm()
        await _one(ctx, t, "warm up", 2)
