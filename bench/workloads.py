"""The workloads. Each one drives every target with the same requests and returns Figures:
one metric, its per-run samples for each target, and which target is the yardstick.

Prompts start with a per-request nonce so no server gets a prompt-cache hit it would not get
from a real client (the multi-turn workload is where prefix reuse is meant to show).
Targets take turns going first in successive runs, so a drift in machine load does not
always land on the same server.
"""

from __future__ import annotations

import asyncio
import time

from .client import Target, stream_chat
from .context import Context, Figure, _check_length, _one, _order, _percentile
from .metrics import SSD_WRITTEN, engine_first, engine_first_means, ssd_written_bytes
from .servers import bare_load
from .turns import SERVER_FAILED, failed, hold_device

WORKLOADS = ("single", "longprompt", "concurrency", "proxy", "multiturn", "swap")


async def single(ctx: Context) -> list[Figure]:
    """One stream at a time: decode tokens/s after the first token, and TTFT."""
    s = ctx.sizes
    tps = Figure("single", "decode tok/s", "tok/s", True, goal=1.0)
    ttft = Figure("single", "TTFT", "s", False)
    for run in range(max(s.repeats, s.single_runs)):
        for t in _order([ctx.mlxd, ctx.mlx_lm], run):
            res = await _one(ctx, t, ctx.prompt(s.single_prompt), s.single_tokens)
            _check_length(tps, res, s.single_tokens)
            tps.add(t.name, res.decode_tps)
            ttft.add(t.name, res.ttft_s)
    return [tps, ttft]


async def _level(
    ctx: Context, target: Target, clients: int, fig: Figure
) -> tuple[float, list[float]]:
    """`clients` clients each sending requests back to back: aggregate tok/s and all TTFTs."""
    s = ctx.sizes
    ttfts: list[float] = []
    tokens = 0

    async def client(session) -> None:
        nonlocal tokens
        for _ in range(s.conc_requests):
            res = await stream_chat(
                session,
                target,
                [{"role": "user", "content": ctx.prompt(s.conc_prompt)}],
                s.conc_tokens,
                ctx.logit_bias,
            )
            _check_length(fig, res, s.conc_tokens)
            ttfts.append(res.ttft_s)
            tokens += res.completion_tokens

    async with target.session() as session:
        t0 = time.monotonic()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        wall = time.monotonic() - t0
    return tokens / wall, ttfts


async def longprompt(ctx: Context) -> list[Figure]:
    """Cold long prompts (what a coding agent sends each turn): TTFT and prefill tok/s for one
    client, then the slowest TTFT of several cold prompts sent at once. Each server's turn
    runs every size, so `exclusive` switches the device once per turn, not once per size."""
    s = ctx.sizes
    sizes: list[tuple[int, Figure, Figure, Figure]] = []
    for n in s.long_prompts:
        size = f"{n / 1024:g}k" if n >= 1024 else str(n)
        sizes.append(
            (
                n,
                Figure("longprompt", f"TTFT {size}", "s", False, goal=0.8),
                Figure("longprompt", f"prefill tok/s {size}", "tok/s", True),
                Figure(
                    "longprompt", f"TTFT {size} ×{s.long_clients} at once (slowest)", "s", False
                ),
            )
        )
    for run in range(s.repeats):
        for t in _order([ctx.mlxd, ctx.mlx_lm], run):
            await hold_device(ctx, t)
            for n, ttft, rate, together in sizes:
                try:
                    res = await _one(ctx, t, ctx.prompt(n, "long"), 8)
                    ttft.add(t.name, res.ttft_s)
                    rate.add(t.name, (res.prompt_tokens or n) / res.ttft_s)
                except SERVER_FAILED as exc:
                    failed(ttft, t, exc)
                many = await asyncio.gather(
                    *(_one(ctx, t, ctx.prompt(n, "long"), 8) for _ in range(s.long_clients)),
                    return_exceptions=True,  # every request ends before the next measurement
                )
                if errors := [r for r in many if isinstance(r, BaseException)]:
                    if not all(isinstance(e, SERVER_FAILED) for e in errors):
                        raise errors[0]
                    failed(together, t, errors[0])  # out of memory, ...
                else:
                    together.add(t.name, max(r.ttft_s for r in many))
    return [fig for _, *figs in sizes for fig in figs]


async def _engine_level(ctx: Context, t: Target, c: int, agg: Figure, parts: list[Figure]):
    """_level, and for the supervisor the mean seconds its requests spent queued in the
    worker and then admitted before their first token (from /metrics, around the level)."""
    before = await engine_first(t) if t is ctx.mlxd else None
    rate, ttfts = await _level(ctx, t, c, agg)
    after = await engine_first(t) if before is not None else None
    if before and after and (means := engine_first_means(before, after)):
        for fig, mean in zip(parts, means, strict=True):
            fig.add(t.name, mean)
    return rate, ttfts


async def concurrency(ctx: Context) -> list[Figure]:
    """Aggregate tokens/s and TTFT p50/p95 at each level of concurrent clients, and what
    mlxd wrote to its SSD tier per request meanwhile (unique prompts should write nothing)."""
    figs: list[Figure] = []
    supervised = ctx.worker is not None
    written_before = await ssd_written_bytes(ctx.mlxd) if supervised else None
    requests = 0
    for c in ctx.sizes.levels:
        agg = Figure(
            "concurrency", f"aggregate tok/s @{c}", "tok/s", True, goal=1.2 if c >= 16 else None
        )
        p50 = Figure("concurrency", f"TTFT p50 @{c}", "s", False)
        p95 = Figure("concurrency", f"TTFT p95 @{c}", "s", False, goal=0.5 if c == 8 else None)
        note = "mlxd only, the mean per request from its /metrics: "
        parts = [
            Figure("concurrency", f"{what} @{c}", "s", False, base="", note=note + why)
            for what, why in (
                ("engine queue wait", "submitted to the engine -> admitted to the batch"),
                ("engine admitted -> first token", "prefill and the steps it shared"),
            )
        ]
        for run in range(ctx.sizes.repeats):
            for t in _order([ctx.mlxd, ctx.mlx_lm], run):
                rate, ttfts = await _engine_level(ctx, t, c, agg, parts)
                requests += len(ttfts) if t is ctx.mlxd else 0
                agg.add(t.name, rate)
                p50.add(t.name, _percentile(ttfts, 0.5))
                p95.add(t.name, _percentile(ttfts, 0.95))
        figs += [agg, p50, p95, *(f for f in parts if f.samples)]
    written_after = await ssd_written_bytes(ctx.mlxd) if supervised else None
    if written_before is not None and written_after is not None and requests:
        ssd = Figure(
            "concurrency",
            "SSD bytes written per request",
            "B",
            False,
            base="",
            note="mlxd only (mlx_lm.server has no SSD tier), from "
            f"{SSD_WRITTEN}; 2026-11-29: ~80 MB per request.",
        )
        ssd.add("mlxd", (written_after - written_before) / requests)
        figs.append(ssd)
    return figs


async def proxy(ctx: Context) -> list[Figure]:
    """The supervisor against the very worker it proxies to, reached on its own socket:
    what the extra hop costs. Requests alternate one by one (pairs), and the ratio is the
    median of the pair ratios, so a drift in machine load does not decide it."""
    if ctx.worker is None:
        return []
    s = ctx.sizes
    note = "paired: supervisor and its worker's socket interleaved request by request"
    tps = Figure("proxy", "decode tok/s", "tok/s", True, base="worker", goal=0.98, paired=True)
    ttft = Figure("proxy", "TTFT", "s", False, base="worker", paired=True, note=note)
    await _one(ctx, ctx.mlxd, ctx.prompt(16), 2)  # the model is loaded (after other workloads)
    for run in range(max(s.repeats, 9)):
        for t in _order([ctx.mlxd, ctx.worker], run):
            res = await _one(ctx, t, ctx.prompt(s.single_prompt), s.single_tokens)
            tps.add(t.name, res.decode_tps)
            ttft.add(t.name, res.ttft_s)
    return [tps, ttft]


async def multiturn(ctx: Context) -> list[Figure]:
    """A growing conversation: TTFT of the cold first turn against the later turns (RAM hits);
    then the last turn's prompt cold (a fresh conversation of the same length) and, for mlxd,
    resent after the model was unloaded and loaded again (an SSD restore)."""
    s = ctx.sizes
    first = Figure("multiturn", "TTFT turn 1 (cold)", "s", False)
    later = Figure("multiturn", f"TTFT turns 2-{s.turns} (median)", "s", False)
    last = Figure("multiturn", f"TTFT turn {s.turns}", "s", False)
    cold = Figure("multiturn", f"TTFT turn {s.turns}'s prompt, cold", "s", False)
    ssd = Figure(
        "multiturn",
        f"TTFT turn {s.turns} resent after an unload",
        "s",
        False,
        note="mlxd: the model was unloaded (its prompt cache drained to SSD) and loaded "
        "again, so the prefix comes back from the SSD tier; mlx_lm.server: the "
        "same resend, served from its RAM cache (it has no tier that outlives an "
        "unload or restart).",
    )
    for run in range(s.repeats):
        for t in _order([ctx.mlxd, ctx.mlx_lm], run):
            messages = [{"role": "system", "content": ctx.prompt(s.turn_system, "conv")}]
            ttfts = []
            async with t.session() as session:
                for _ in range(s.turns):
                    messages.append({"role": "user", "content": ctx.prompt(s.turn_user)})
                    res = await stream_chat(session, t, messages, s.turn_tokens, ctx.logit_bias)
                    messages.append({"role": "assistant", "content": res.text})
                    ttfts.append(res.ttft_s)
                fresh = [
                    {"role": "system", "content": ctx.prompt(s.turn_system, "cold")},
                    *messages[1:-1],
                ]
                res = await stream_chat(session, t, fresh, s.turn_tokens, ctx.logit_bias)
                cold.add(t.name, res.ttft_s)
                if t is ctx.mlxd and ctx.unload_mlxd is not None:
                    await ctx.unload_mlxd()
                    await stream_chat(session, t, [{"role": "user", "content": "warm up"}], 2)
                res = await stream_chat(session, t, messages[:-1], s.turn_tokens, ctx.logit_bias)
                ssd.add(t.name, res.ttft_s)
            first.add(t.name, ttfts[0])
            later.add(t.name, _percentile(ttfts[1:], 0.5))
            last.add(t.name, ttfts[-1])
    figures = [first, later, last, cold]
    return figures + ([ssd] if ctx.unload_mlxd is not None else [])


async def swap(ctx: Context) -> list[Figure]:
    """Serving model B right after model A: mlxd against a fresh `mlx_lm.load` of B, and
    against mlx_lm.server switching models in-process (a request naming B's folder)."""
    s = ctx.sizes
    vs_bare = Figure("swap", "serve B after A", "s", False, base="bare_load", note=ctx.swap_how)
    vs_server = Figure(
        "swap",
        "serve B after A",
        "s",
        False,
        note="mlx_lm.server swaps in-process on a request naming B's folder.",
    )
    parts: dict[str, list[float]] = {}
    for run in range(s.repeats):
        prompt = ctx.prompt(16, "swap")
        mlxd_s = await ctx.mlxd_swap(run, prompt)
        bare = await bare_load(ctx.model_b, prompt)
        server_s = await _mlx_lm_swap(ctx, prompt)
        for fig in (vs_bare, vs_server):
            fig.add("mlxd", mlxd_s)
        vs_bare.add("bare_load", bare["total_s"])
        vs_server.add("mlx_lm", server_s)
        for k, v in bare.items():
            parts.setdefault(k, []).append(v)
    # Where the fresh process spends its time, to read the ratio against.
    vs_bare.note += (
        " Fresh mlx_lm.load (medians): "
        + ", ".join(
            f"{k[:-2].replace('_', ' ')} {_percentile(v, 0.5):.2f} s"
            for k, v in parts.items()
            if k != "total_s"
        )
        + "."
    )
    return [vs_bare, vs_server]


async def _mlx_lm_swap(ctx: Context, prompt: str) -> float:
    target = ctx.mlx_lm
    messages = [{"role": "user", "content": prompt}]
    async with target.session() as session:
        await stream_chat(session, target, messages, 2, ctx.logit_bias)  # A is loaded
        res = await stream_chat(session, target, messages, 1, model=str(ctx.model_b))
    return res.ttft_s
