"""`python -m bench families`: a sliding-window or hybrid model, mlxd vs mlx_lm.server.

Issue 34's figures: both servers side by side on one model of another family.

    python -m bench families --shape tiny-gemma3 --turn-tokens 600 --repeats 1   # CPU smoke
    python -m bench families --shape gemma3-12b                                   # H200
    python -m bench families --shape nemotron-h-8b

single: one stream, decode tok/s and TTFT (--single-prompt + --single-tokens).
8 clients: --clients clients at once, --conc-requests each back to back: aggregate tok/s,
TTFT p50/p95 (bench run's `single` and `concurrency` workloads at these sizes).
multi-turn, one part per run: turn 1 is a conversation of --turn-tokens tokens (a cold
prompt: its TTFT is the cold long-prompt figure); turn 2 adds the reply and --user-tokens (a
RAM hit), then is sent again (the same prompt from RAM). mlxd then unloads the model through
/admin (its prompt cache drains to the SSD tier), waits for "available", loads it again
(timed apart, then a short warm-up request) and resends turn 2: an SSD restore. Last, turn 2
with a fresh system prompt of the same length: a cold re-prefill, on both servers. The
issue's targets are mlxd's own pair ratios: reload TTFT / RAM-hit TTFT (<= 1.5x) and reload
TTFT / cold re-prefill TTFT (<= 0.3x).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass

from . import context, served, turns, workloads
from .agent_prompts import hit_ratio
from .client import BenchError, StreamResult, Target, stream_chat
from .context import Context, Figure, _order
from .session import admin_action

# mlxd's own yardsticks: the targets, and the same prompt resent from RAM
RAM, COLD, RESEND = "mlxd_ram", "mlxd_cold", "mlxd_resend"
STATUS_TIMEOUT_S = 180.0  # an unload drains and stops, a load reads the weights again


@dataclass(frozen=True)
class FamilySizes:
    """How big each part is (the CLI's flags)."""

    repeats: int = 2
    single_prompt: int = 512
    single_tokens: int = 256
    clients: int = 8
    conc_prompt: int = 512
    conc_tokens: int = 128
    conc_requests: int = 2  # per client, back to back
    turn_tokens: int = 16384  # turn 1's whole prompt
    user_tokens: int = 256  # each user message
    reply_tokens: int = 32  # each turn's output

    def run_sizes(self) -> context.Sizes:
        """bench run's sizes for its `single` and `concurrency` workloads."""
        return dataclasses.replace(
            context.FULL,
            repeats=self.repeats,
            single_runs=self.repeats,
            single_prompt=self.single_prompt,
            single_tokens=self.single_tokens,
            levels=(self.clients,),
            conc_prompt=self.conc_prompt,
            conc_tokens=self.conc_tokens,
            conc_requests=self.conc_requests,
        )


HELP = {  # FamilySizes' fields as flags (besides --repeats)
    "single_prompt": "single: prompt tokens",
    "single_tokens": "single: output tokens",
    "clients": "clients at once",
    "conc_prompt": "clients: prompt tokens",
    "conc_tokens": "clients: output tokens",
    "conc_requests": "clients: requests each, back to back",
    "turn_tokens": "multi-turn: turn 1's prompt tokens (the cold long prompt)",
    "user_tokens": "multi-turn: tokens of each user message",
    "reply_tokens": "multi-turn: output tokens per turn",
}


def reused(workload, sizes: context.Sizes) -> served.Workload:
    """One of bench run's workloads at these sizes."""

    async def part(ctx: Context, notes: list[str]) -> list[Figure]:
        return await workload(dataclasses.replace(ctx, sizes=sizes))

    return part


def turn_figures(sz: FamilySizes) -> dict[str, Figure]:
    """The multi-turn figures, filled by every run."""
    size = f"{sz.turn_tokens / 1024:g}k" if sz.turn_tokens >= 1024 else str(sz.turn_tokens)
    mt = "multi-turn"
    after = "TTFT turn 2 after unload + load"
    # mlxd against itself, pair by pair (samples of one run side by side): drift cancels out.
    target = lambda metric, base, goal, note="": Figure(  # noqa: E731
        "target", metric, "s", False, base=base, goal=goal, note=note, paired=True
    )
    return {
        "cold": Figure("cold prompt", f"TTFT {size} tok (turn 1)", "s", False),
        "ram": Figure(mt, "TTFT turn 2 (RAM hit)", "s", False),
        "ram_hit": Figure(mt, "turn 2 prompt from cache (RAM)", "%", True),
        "resend": Figure(mt, "TTFT turn 2 resent (RAM, same prompt)", "s", False),
        "recold": Figure(mt, "TTFT turn 2, cold re-prefill", "s", False),
        "reload": Figure(
            mt,
            after,
            "s",
            False,
            note="mlxd: from its SSD tier (read into RAM by its read-ahead once loaded, or "
            "restored by the request); mlx_lm.server: its cold re-prefill (its "
            "cache does not outlive an unload or restart).",
        ),
        "reload_hit": Figure(mt, "turn 2 prompt from cache after reload", "%", True, base=""),
        "vs_ram": target(f"{after} / RAM hit", RAM, 1.5),
        "vs_cold": target(f"{after} / cold re-prefill", COLD, 0.3),
        "vs_resend": target(
            f"{after} / turn 2 resent from RAM",
            RESEND,
            None,
            "no goal: the same prompt from either tier, what the SSD restore adds. The "
            "targets' RAM hit prefills turn 2's new part (reply and user message); the "
            "resend after the reload finds all of it cached.",
        ),
        "unload": Figure(mt, "unload (drain to SSD, stop)", "s", False, base=""),
        "load": Figure(mt, "load again", "s", False, base=""),
    }


async def _wait_status(t: Target, want: str) -> None:
    """Poll GET /v1/models/<id> until the model's status is `want` ("available", ...)."""
    deadline = time.monotonic() + STATUS_TIMEOUT_S
    async with t.session() as http:
        while time.monotonic() < deadline:
            async with http.get(f"/v1/models/{t.model}") as r:
                r.raise_for_status()
                if (await r.json()).get("status") == want:
                    return
            await asyncio.sleep(0.2)
    raise BenchError(f"{t.name}: model {t.model} not {want!r} after {STATUS_TIMEOUT_S:.0f}s")


async def _reload(ctx: Context, figs: dict[str, Figure], notes: list[str]) -> None:
    """Unload mlxd's model (drain to SSD), wait until it is "available", load it again."""
    t = ctx.mlxd
    unload = await admin_action(t, t.model, "unload")
    await _wait_status(t, "available")
    load = await admin_action(t, t.model, "load")
    await _wait_status(t, "loaded")
    figs["unload"].add(t.name, unload["elapsed_s"])
    figs["load"].add(t.name, load["elapsed_s"])
    if not any(n.startswith("drain report") for n in notes):
        notes.append(f"drain report (mlxd's first unload): {unload.get('drain')}")
    async with t.session() as http:  # the new worker's first request: kernels, buffers
        await stream_chat(http, t, [{"role": "user", "content": "warm up"}], 2)
        # The resend that follows meets what the read-ahead (on by default) put in RAM by now.
        async with http.get("/admin/stats") as r:
            body = (await r.json()).get("workers", {}).get(t.model, {}).get("body", {})
    ahead = {k[len("cache_read_ahead_") :]: v for k, v in body.items() if "read_ahead" in k}
    run = len(figs["load"].samples.get(t.name, []))
    notes.append(f"mlxd's SSD read-ahead before run {run}'s resend: {ahead or 'not reported'}")


def _hit(res: StreamResult) -> float | None:
    ratio = hit_ratio([res.cached_tokens], [res.prompt_tokens])
    return None if ratio is None else 100 * ratio


async def _conversation(ctx, t: Target, sz: FamilySizes, figs, notes: list[str]) -> None:
    """One server's turns; mlxd's unload and reload between turn 2 and its resend."""
    chat = lambda http, messages: stream_chat(  # noqa: E731
        http, t, messages, sz.reply_tokens, ctx.logit_bias
    )
    system_tokens = max(16, sz.turn_tokens - sz.user_tokens)
    messages = [
        {"role": "system", "content": ctx.prompt(system_tokens, "conv")},
        {"role": "user", "content": ctx.prompt(sz.user_tokens, "user")},
    ]
    async with t.session() as http:
        first = await chat(http, messages)
        messages += [
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": ctx.prompt(sz.user_tokens, "user")},
        ]
        ram = await chat(http, messages)
        resend = await chat(http, messages)
    figs["cold"].add(t.name, first.ttft_s)
    figs["ram"].add(t.name, ram.ttft_s)
    figs["resend"].add(t.name, resend.ttft_s)
    if (hit := _hit(ram)) is not None:
        figs["ram_hit"].add(t.name, hit)
    restored = None
    if t is ctx.mlxd and ctx.unload_mlxd is not None:
        await _reload(ctx, figs, notes)
        async with t.session() as http:
            restored = await chat(http, messages)
        if (hit := _hit(restored)) is not None:
            figs["reload_hit"].add(t.name, hit)
    fresh = [{"role": "system", "content": ctx.prompt(system_tokens, "cold")}, *messages[1:]]
    async with t.session() as http:
        cold = await chat(http, fresh)
    figs["recold"].add(t.name, cold.ttft_s)
    if t is ctx.mlx_lm:
        figs["reload"].add(t.name, cold.ttft_s)
    elif restored is not None:  # the pairs of one run, added together so they stay aligned
        figs["reload"].add(t.name, restored.ttft_s)
        for key, base, value in (
            ("vs_ram", RAM, ram.ttft_s),
            ("vs_cold", COLD, cold.ttft_s),
            ("vs_resend", RESEND, resend.ttft_s),
        ):
            figs[key].add(t.name, restored.ttft_s)
            figs[key].add(base, value)
    if not any(n.startswith(f"prompt tokens, {t.name}") for n in notes):
        notes.append(
            f"prompt tokens, {t.name}: turn 1 {first.prompt_tokens}, turn 2 {ram.prompt_tokens}"
        )


class MultiTurn:
    """The multi-turn part, one run per call (the report is written after each run)."""

    def __init__(self, sz: FamilySizes):
        self.sz = sz
        self.figs = turn_figures(sz)
        self.shown = False

    def run(self, run: int) -> served.Workload:
        async def part(ctx: Context, notes: list[str]) -> list[Figure]:
            try:
                for t in _order([ctx.mlxd, ctx.mlx_lm], run):
                    await turns.hold_device(ctx, t)  # with --exclusive: the device to itself
                    await _conversation(ctx, t, self.sz, self.figs, notes)
            except turns.SERVER_FAILED as exc:  # the figures of the runs done still count
                notes.append(f"multi-turn run {run + 1}: failed: {type(exc).__name__}: {exc}")
            if ctx.unload_mlxd is None and not self.shown:
                notes.append("multi-turn: no unload and reload, the supervisor is not running")
            first, self.shown = not self.shown, True
            return list(self.figs.values()) if first else []

        return part


def main(argv: list[str]) -> int:
    d = FamilySizes()
    p = served.parser("families", __doc__, d.repeats)
    for name, what in HELP.items():
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name), help=what)
    # The multi-turn part first: the targets, measured before a timeout can cut in,
    # and its first unload drains only its own entries (not every 512-token prompt's).
    p.add_argument("--only", default="multiturn,single,clients", help="which parts, in order")
    a = p.parse_args(argv)
    sz = FamilySizes(**{f.name: getattr(a, f.name) for f in dataclasses.fields(FamilySizes)})
    only = [w.strip() for w in a.only.split(",") if w.strip()]
    if not set(only) <= {"single", "clients", "multiturn"}:
        p.error("--only: single, clients, multiturn")
    multiturn = MultiTurn(sz)
    every = {
        "single": [("single", reused(workloads.single, sz.run_sizes()))],
        "clients": [
            (f"{sz.clients} clients", reused(workloads.concurrency, sz.run_sizes())),
        ],
        "multiturn": [(f"multi-turn run {i + 1}", multiturn.run(i)) for i in range(sz.repeats)],
    }
    parts = [part for name in only for part in every[name]]
    text = (
        f"{sz.repeats} runs; single {sz.single_prompt}+{sz.single_tokens} tok; "
        f"{sz.clients} clients × {sz.conc_requests} × {sz.conc_prompt}+{sz.conc_tokens} tok; "
        f"multi-turn: turn 1 {sz.turn_tokens} tok, turn 2 +{sz.user_tokens} tok, "
        f"{sz.reply_tokens} tok out per turn"
    )
    return served.main(a, parts, text)
