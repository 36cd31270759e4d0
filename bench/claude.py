"""`python -m bench claude`: Claude-Code-shaped sessions, two in a row on the same project.

    python -m bench claude                                  # tiny model, CPU
    python -m bench claude --shape qwen3-8b --instructions 6000

Each run: a fresh project (long instructions, ~20 tools); session 1, then session 2 with
the same bodies except the billing line's per-session suffix (see bench/agent_prompts.py).
Each session is --turns turns.

messages (mlxd only: mlx_lm.server has no /v1/messages): the real shape, `max_tokens: 32000`,
streamed; the client hangs up after --tokens output deltas (a random-weight model would
otherwise write 32000 tokens). The prompt part reused by session 2's first turn is the
supervisor's /metrics cache-hit tokens counted for the request (read once the engine counted
its first token) over the prompt's length from /v1/messages/count_tokens: the hung-up
stream never gets its final usage. (The engine's prompt-token counter counts what it
prefilled, not the prompt: it cannot be the denominator.)
chat (both servers): the same content through /v1/chat/completions (system blocks joined),
--tokens output tokens with EOS forbidden, streamed to the end; reuse from usage cached_tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

import orjson

from . import served
from .agent_prompts import claude_body, claude_chat, hit_ratio, openai_tools
from .client import BenchError, Target, stream_chat
from .context import Context, Figure, _order, _percentile
from .metrics import metric_sums
from .turns import hold_device


@dataclass(frozen=True)
class ClaudeSizes:
    """How big the Claude Code sessions are (the CLI's flags)."""

    instructions: int = 6000  # the long system block, tokens
    turns: int = 3
    tokens: int = 32  # output tokens read per turn
    repeats: int = 3
    tools: int = 20
    user: int = 200  # each user turn, tokens


HIT_TOKENS = "mlxd_prompt_cache_hit_tokens_total"
FIRST_TOKENS = "mlxd_engine_queue_wait_seconds_count"  # rows that got a first token


async def stream_messages(http, t: Target, body: dict[str, Any], deltas: int) -> tuple[float, str]:
    """POST /v1/messages streamed; hang up after `deltas` content deltas (or the end).
    Returns the TTFT (first content delta of any kind) and the text."""
    t0 = time.monotonic()
    ttft = None
    text: list[str] = []
    seen = 0
    async with http.post(
        "/v1/messages", data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    ) as resp:
        if resp.status != 200:
            raise BenchError(f"{t.name}: HTTP {resp.status}: {(await resp.text())[:300]}")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            event = orjson.loads(line[5:].strip())
            if event.get("type") == "error":
                raise BenchError(f"{t.name}: stream error: {event.get('error')}")
            if event.get("type") != "content_block_delta":
                continue
            if ttft is None:
                ttft = time.monotonic() - t0
            delta = event.get("delta") or {}
            text.append(delta.get("text") or delta.get("thinking") or "")
            seen += 1
            if seen >= deltas:
                break  # leaving the block closes the connection: the server cancels
    return (ttft if ttft is not None else time.monotonic() - t0), "".join(text)


async def _counters(t: Target) -> dict[str, float] | None:
    return await metric_sums(t, HIT_TOKENS, FIRST_TOKENS, model=t.model)


async def prompt_length(http, body: dict[str, Any]) -> int | None:
    """The body's prompt tokens by the server's own count (/v1/messages/count_tokens)."""
    counted = {k: v for k, v in body.items() if k not in ("max_tokens", "stream")}
    async with http.post(
        "/v1/messages/count_tokens",
        data=orjson.dumps(counted),
        headers={"Content-Type": "application/json"},
    ) as resp:
        if resp.status != 200:
            return None
        n = (await resp.json()).get("input_tokens")
    return n if isinstance(n, int) and n > 0 else None


async def _reused(t: Target, before, prompt: int | None, timeout_s: float = 10.0):
    """The share of a `prompt`-token request served from the cache: the hit tokens counted
    since `before`, once the engine has counted the request's first token (None: not seen)."""
    if before is None or prompt is None:
        return None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        after = await _counters(t)
        if after and after[FIRST_TOKENS] > before[FIRST_TOKENS]:
            return (after[HIT_TOKENS] - before[HIT_TOKENS]) / prompt
        await asyncio.sleep(0.2)
    return None


def _figs(api: str, base: str) -> dict[str, Figure]:
    f = lambda m, unit="s", hib=False: Figure("claude", f"{api}: {m}", unit, hib, base=base)  # noqa: E731
    return {
        "ttft1": f("TTFT session 1 turn 1"),
        "ttft2": f("TTFT session 2 turn 1"),
        "later": f("TTFT later turns p50"),
        "reused": f("session 2 turn 1 prompt reused", "%", True),
    }


async def _messages_run(ctx: Context, figs, instructions: str, sz: ClaudeSizes) -> None:
    t = ctx.mlxd
    users = [ctx.prompt(sz.user, "claude-user") for _ in range(sz.turns)]
    later: list[float] = []
    async with t.session() as http:
        for n in (1, 2):
            suffix = os.urandom(3).hex()[:5]
            replies: list[str] = []
            for turn in range(sz.turns):
                body = claude_body(
                    instructions, suffix, users[: turn + 1], replies, t.model, sz.tools
                )
                first = n == 2 and turn == 0
                before = await _counters(t) if first else None
                prompt = await prompt_length(http, body) if first else None
                ttft, text = await stream_messages(http, t, body, sz.tokens)
                replies.append(text)
                if turn:
                    later.append(ttft)
                else:
                    figs["ttft1" if n == 1 else "ttft2"].add(t.name, ttft)
                if (reused := await _reused(t, before, prompt)) is not None:
                    figs["reused"].add(t.name, 100 * reused)
    figs["later"].add(t.name, _percentile(later, 0.5) if later else 0.0)


async def _chat_run(ctx: Context, t: Target, figs, instructions: str, sz: ClaudeSizes):
    users = [ctx.prompt(sz.user, "claude-user") for _ in range(sz.turns)]
    tools = openai_tools(sz.tools)
    later: list[float] = []
    async with t.session() as http:
        for n in (1, 2):
            suffix = os.urandom(3).hex()[:5]
            replies: list[str] = []
            for turn in range(sz.turns):
                messages = claude_chat(instructions, suffix, users[: turn + 1], replies)
                res = await stream_chat(http, t, messages, sz.tokens, ctx.logit_bias, tools=tools)
                replies.append(res.text)
                if turn:
                    later.append(res.ttft_s)
                    continue
                figs["ttft1" if n == 1 else "ttft2"].add(t.name, res.ttft_s)
                if n == 2:
                    ratio = hit_ratio([res.cached_tokens], [res.prompt_tokens])
                    if ratio is not None:
                        figs["reused"].add(t.name, 100 * ratio)
    if later:
        figs["later"].add(t.name, _percentile(later, 0.5))


def claude(sz: ClaudeSizes, apis: set[str]):
    async def workload(ctx: Context, notes: list[str]) -> list[Figure]:
        msg, chat = _figs("messages", ""), _figs("chat", "mlx_lm")
        for run in range(sz.repeats):
            for t in _order([ctx.mlxd, ctx.mlx_lm], run):
                await hold_device(ctx, t)
                # A fresh project each time, so no session starts from another's cache.
                if t is ctx.mlxd and "messages" in apis:
                    project = ctx.prompt(sz.instructions, "claude")
                    await _messages_run(ctx, msg, project, sz)
                if "chat" in apis:
                    project = ctx.prompt(sz.instructions, "claude")
                    await _chat_run(ctx, t, chat, project, sz)
        if not msg["reused"].samples and "messages" in apis:
            msg["reused"].note = "no supervisor /metrics to read the reuse from"
        msg["ttft1"].note = "mlxd only (mlx_lm.server has no /v1/messages); max_tokens 32000"
        chat["ttft1"].note = "the same content through /v1/chat/completions on both servers"
        return [f for f in (*msg.values(), *chat.values()) if f.samples]

    return workload


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench claude", description=__doc__.splitlines()[0])
    served.common_args(p)
    p.add_argument("--instructions", type=int, default=6000, help="instructions block, tokens")
    p.add_argument("--turns", type=int, default=3, help="turns per session")
    p.add_argument("--user", type=int, default=200, help="tokens of each user turn")
    p.add_argument("--tokens", type=int, default=32, help="output tokens read per turn")
    p.add_argument("--tools", type=int, default=20, help="tools in each body (max 20)")
    p.add_argument("--only", default="messages,chat", help="messages, chat or both")
    a = p.parse_args(argv)
    apis = {w.strip() for w in a.only.split(",")}
    if not apis <= {"messages", "chat"}:
        p.error("--only: messages, chat")
    sz = ClaudeSizes(a.instructions, a.turns, a.tokens, a.repeats, a.tools, a.user)
    parts = [("claude", claude(sz, apis))]
    text = (
        f"{sz.repeats} runs; 2 sessions × {sz.turns} turns of +{sz.user} tok, instructions "
        f"{sz.instructions} tok, {sz.tools} tools, {sz.tokens} output tokens read per turn"
    )
    return served.main(a, parts, text)
