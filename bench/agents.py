"""`python -m bench agents`: coding-agent sessions sharing one long prefix, and a burst of
clients arriving together, mlxd and mlx_lm.server side by side.

    python -m bench agents                                  # tiny model, CPU, short prompts
    python -m bench agents --shape qwen3-0.6b --levels 1,4,8,16 --prefix 6000
    python -m bench agents --shape qwen3-8b --levels 4,8 --only agents

agents: K sessions at once, each the same system prompt and tool list (--prefix tokens in
all), primed once first as an earlier session would have; every turn appends --user tokens
to that session and asks --tokens output tokens (greedy, streamed, EOS forbidden). Per K:
TTFT p50/p95 of first and of later turns, session wall p50/max, the whole run's wall, and
the prompt tokens served from the prefix cache (usage.prompt_tokens_details.cached_tokens,
which both servers send).
burst: --burst clients each sending one --burst-prompt token prompt at the same moment:
TTFT p50/p95 and aggregate tok/s (all completion tokens over the wall).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass, replace

from . import served
from .agent_prompts import hit_ratio, openai_tools, session_messages
from .client import StreamResult, Target, stream_chat
from .context import Context, Figure, _check_length, _order, _percentile, at_once
from .turns import hold_device


@dataclass(frozen=True)
class AgentSizes:
    """How big the agent workloads are (the CLI's flags)."""

    levels: tuple[int, ...] = (1, 4, 8, 16)
    prefix: int = 6000  # the shared system prompt and tool list, tokens
    turns: int = 4
    user: int = 200  # tokens each turn appends
    tokens: int = 64  # output tokens per turn
    repeats: int = 3
    burst: int = 32
    burst_prompt: int = 300
    burst_tokens: int = 128
    tools: int = 20  # of the tool list (bench/agent_prompts.py), part of the prefix


def tools_tokens(tools: list, tokenizer) -> int:
    """About how many prompt tokens the tool list takes (its JSON, tokenized)."""
    text = json.dumps(tools)
    return len(tokenizer.encode(text).ids) if tokenizer is not None else len(text) // 4


@dataclass
class RunResult:
    """One server's sessions at one K: every turn's result and each session's wall."""

    turns: list[list[StreamResult]]  # per session, per turn
    session_s: list[float]
    wall_s: float


async def _session(
    http, t: Target, ctx: Context, system: str, tools: list, sz: AgentSizes
) -> tuple[list[StreamResult], float]:
    users: list[str] = []
    replies: list[str] = []
    results = []
    t0 = time.monotonic()
    for _ in range(sz.turns):
        users.append(ctx.prompt(sz.user, "turn"))
        messages = session_messages(system, users, replies)
        res = await stream_chat(http, t, messages, sz.tokens, ctx.logit_bias, tools=tools)
        replies.append(res.text)
        results.append(res)
    return results, time.monotonic() - t0


async def run_sessions(ctx: Context, t: Target, k: int, sz: AgentSizes) -> RunResult:
    """Prime the shared prefix, then K sessions at once; the prefix is fresh for each call."""
    tools = openai_tools(sz.tools)
    system = ctx.prompt(max(16, sz.prefix - tools_tokens(tools, ctx.tokenizer)), "agents")
    async with t.session() as http:
        prime = session_messages(system, [ctx.prompt(sz.user, "prime")], [])
        await stream_chat(http, t, prime, 8, ctx.logit_bias, tools=tools)
        t0 = time.monotonic()
        done = await asyncio.gather(*(_session(http, t, ctx, system, tools, sz) for _ in range(k)))
        wall = time.monotonic() - t0
    return RunResult([d[0] for d in done], [d[1] for d in done], wall)


def level_figures(k: int) -> dict[str, Figure]:
    """The figures of one K, by key."""
    f = lambda metric, unit="s", hib=False: Figure("agents", f"{metric} @{k}", unit, hib)  # noqa: E731
    return {
        "first50": f("TTFT first turns p50"),
        "first95": f("TTFT first turns p95"),
        "later50": f("TTFT later turns p50"),
        "later95": f("TTFT later turns p95"),
        "sess50": f("session wall p50"),
        "sessmax": f("session wall max"),
        "wall": f("whole-run wall"),
        "hit_first": f("prefix-cache hit, first turns", "%", True),
        "hit": f("prefix-cache hit, all turns", "%", True),
    }


def add_run(figs: dict[str, Figure], name: str, r: RunResult) -> None:
    """One run's samples: percentiles over this run's requests and sessions."""
    first = [s[0] for s in r.turns]
    later = [x for s in r.turns for x in s[1:]]
    figs["first50"].add(name, _percentile([x.ttft_s for x in first], 0.5))
    figs["first95"].add(name, _percentile([x.ttft_s for x in first], 0.95))
    if later:
        figs["later50"].add(name, _percentile([x.ttft_s for x in later], 0.5))
        figs["later95"].add(name, _percentile([x.ttft_s for x in later], 0.95))
    figs["sess50"].add(name, _percentile(r.session_s, 0.5))
    figs["sessmax"].add(name, max(r.session_s))
    figs["wall"].add(name, r.wall_s)
    for key, rs in (("hit_first", first), ("hit", first + later)):
        ratio = hit_ratio([x.cached_tokens for x in rs], [x.prompt_tokens for x in rs])
        if ratio is not None:
            figs[key].add(name, 100 * ratio)
        elif f"{name} reports no cached tokens" not in figs[key].note:
            figs[key].note += f"{name} reports no cached tokens. "


def agents(sz: AgentSizes):
    async def workload(ctx: Context, notes: list[str]) -> list[Figure]:
        out: list[Figure] = []
        prompt_sizes: list[int] = []
        for k in sz.levels:
            figs = level_figures(k)
            for run in range(sz.repeats):
                for t in _order([ctx.mlxd, ctx.mlx_lm], run):
                    await hold_device(ctx, t)
                    r = await run_sessions(ctx, t, k, sz)
                    for s in r.turns:
                        for x in s:
                            _check_length(figs["wall"], x, sz.tokens)
                    prompt_sizes += [s[0].prompt_tokens or 0 for s in r.turns]
                    add_run(figs, t.name, r)
            out += [f for f in figs.values() if f.samples]
        if prompt_sizes:
            k = "/".join(map(str, sz.levels))
            notes.append(
                f"agents @{k}: first-turn prompts {statistics.median(prompt_sizes):.0f} tok"
            )
        return out

    return workload


def burst(sz: AgentSizes):
    async def workload(ctx: Context, notes: list[str]) -> list[Figure]:
        n = sz.burst
        p50 = Figure("burst", f"TTFT p50 ×{n}", "s", False)
        p95 = Figure("burst", f"TTFT p95 ×{n}", "s", False)
        agg = Figure("burst", f"aggregate tok/s ×{n}", "tok/s", True)
        for run in range(sz.repeats):
            for t in _order([ctx.mlxd, ctx.mlx_lm], run):
                await hold_device(ctx, t)
                rs, wall = await at_once(ctx, [t] * n, sz.burst_prompt, sz.burst_tokens, "burst")
                for r in rs:
                    _check_length(agg, r, sz.burst_tokens)
                p50.add(t.name, _percentile([r.ttft_s for r in rs], 0.5))
                p95.add(t.name, _percentile([r.ttft_s for r in rs], 0.95))
                agg.add(t.name, sum(r.completion_tokens for r in rs) / wall)
        return [p50, p95, agg]

    return workload


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench agents", description=__doc__.splitlines()[0])
    served.common_args(p)
    d = AgentSizes()
    p.add_argument("--levels", type=served.ints, default=d.levels, help="K sessions at once")
    p.add_argument("--prefix", type=int, default=d.prefix, help="shared prefix, tokens")
    p.add_argument("--turns", type=int, default=d.turns, help="turns per session")
    p.add_argument("--user", type=int, default=d.user, help="tokens each turn appends")
    p.add_argument("--tokens", type=int, default=d.tokens, help="output tokens per turn")
    p.add_argument("--burst", type=int, default=d.burst, help="burst clients at once")
    p.add_argument("--burst-prompt", type=int, default=d.burst_prompt, help="their prompts")
    p.add_argument("--burst-tokens", type=int, default=d.burst_tokens, help="their outputs")
    p.add_argument("--tools", type=int, default=d.tools, help="tools in the prefix (max 20)")
    p.add_argument("--only", default="agents,burst", help="agents, burst or both")
    a = p.parse_args(argv)
    sz = AgentSizes(
        a.levels, a.prefix, a.turns, a.user, a.tokens, a.repeats, a.burst, a.burst_prompt,
        a.burst_tokens, a.tools,
    )  # fmt: skip
    only = {w.strip() for w in a.only.split(",")}
    if not only <= {"agents", "burst"}:
        p.error("--only: agents, burst")
    # One part per K: the report is written after each, so a run cut short keeps those done.
    parts = [(f"agents @{k}", agents(replace(sz, levels=(k,)))) for k in sz.levels]
    parts = (parts if "agents" in only else []) + (
        [("burst", burst(sz))] if "burst" in only else []
    )
    text = (
        f"{sz.repeats} runs; agents: K {'/'.join(map(str, sz.levels))}, prefix {sz.prefix} "
        f"tok, {sz.turns} turns of +{sz.user} tok -> {sz.tokens} tok; burst: {sz.burst} "
        f"clients × {sz.burst_prompt}+{sz.burst_tokens} tok"
    )
    return served.main(a, parts, text)
