"""What every workload shares: the sizes, a Figure of per-run samples, the run Context (targets,
prompts), and the small helpers that time one request and summarize runs."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from .client import StreamResult, Target, stream_chat


@dataclass(frozen=True)
class Sizes:
    """How big each workload is; `--quick` picks the small set."""

    repeats: int = 3
    single_runs: int = 5  # single's least runs: one stream is the noisiest figure
    single_prompt: int = 512
    single_tokens: int = 256
    long_prompts: tuple[int, ...] = (2048, 8192, 16384)  # cold prompts, tokens
    long_clients: int = 4  # the "at once" figure: this many cold long prompts together
    # longprompt with one server holding the device at a time: mlxd's model is unloaded before
    # mlx_lm.server's turn (and warmed up again before its own), for models whose long
    # prefills do not fit twice on one GPU.
    exclusive: bool = False
    levels: tuple[int, ...] = (1, 8, 16, 32)
    conc_prompt: int = 512
    conc_tokens: int = 128
    conc_requests: int = 4  # per client, back to back
    turns: int = 6
    turn_system: int = 1024
    turn_user: int = 128
    turn_tokens: int = 64


FULL = Sizes()
QUICK = Sizes(
    single_prompt=128,
    single_tokens=128,
    long_prompts=(256, 1024),
    long_clients=2,
    levels=(1, 4, 8),
    conc_prompt=128,
    conc_tokens=32,
    conc_requests=2,
    turns=4,
    turn_system=256,
    turn_user=48,
    turn_tokens=16,
)


@dataclass
class Figure:
    """One metric: per-run samples per target; the report shows subject / base."""

    workload: str
    metric: str
    unit: str
    higher_is_better: bool
    samples: dict[str, list[float]] = field(default_factory=dict)
    subject: str = "mlxd"
    base: str = "mlx_lm"
    goal: float | None = None  # the ratio to reach: >= goal if higher is better, else <=
    note: str = ""
    # Samples taken in pairs (subject i beside base i): the ratio is the median of the pair
    # ratios, so drift in machine load cancels out of it.
    paired: bool = False

    def add(self, target: str, value: float) -> None:
        self.samples.setdefault(target, []).append(value)


@dataclass
class Context:
    """Everything a workload needs: sizes, the targets, and the model's stop-token bias."""

    sizes: Sizes
    model_a: Path
    model_b: Path
    logit_bias: dict[str, float]
    tokenizer: object | None  # `tokenizers.Tokenizer`, to size prompts; None: count words
    mlxd: Target
    mlx_lm: Target
    worker: Target | None  # None when mlxd already is the worker (no supervisor)
    # Time for mlxd to serve model B after A: (run, prompt) -> seconds to B's first token.
    mlxd_swap: Callable[[int, str], Awaitable[float]] | None = None
    swap_how: str = ""
    # Unload mlxd's model A (drain: its prompt cache goes to SSD); None without a supervisor.
    unload_mlxd: Callable[[], Awaitable[None]] | None = None
    # Stop mlx_lm.server / start it again (its device memory freed between its turns).
    stop_mlx_lm: Callable[[], Awaitable[None]] | None = None
    ensure_mlx_lm: Callable[[], Awaitable[None]] | None = None
    _nonce: itertools.count = field(default_factory=lambda: itertools.count(1))
    # Differs per run, so prompts never repeat across runs (caches can outlive a process).
    _run_id: str = field(default_factory=lambda: os.urandom(3).hex())

    def prompt(self, n_tokens: int, tag: str = "") -> str:
        """About `n_tokens` of filler text behind a fresh nonce (the exact count is in usage)."""
        return filler(n_tokens, f"{tag}{self._run_id}-{next(self._nonce)}", self.tokenizer)


def filler(n_tokens: int, key: str, tokenizer=None) -> str:
    """About `n_tokens` of filler text, different for each `key` (which leads it, so no two
    keys share a cached prefix); `tokenizer` (`tokenizers.Tokenizer`) sizes it exactly."""
    rng = random.Random(key)
    words = " ".join(rng.choice(_WORDS) for _ in range(n_tokens * 2))
    text = f"[{key}] {words}"
    if tokenizer is None:  # roughly 1.3 tokens per English word
        return " ".join(text.split()[: max(1, int(n_tokens / 1.3))])
    ids = tokenizer.encode(text, add_special_tokens=False).ids[:n_tokens]
    return tokenizer.decode(ids)


_WORDS = (
    "the model reads a prompt and predicts the next token until it stops while the server "
    "streams every token back to the client over one connection with low latency and "
    "high throughput across many requests that share the same machine and memory"
).split()


def _order(targets: list[Target], run: int) -> list[Target]:
    return targets if run % 2 == 0 else targets[::-1]


def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


async def _one(ctx: Context, target: Target, prompt: str, max_tokens: int) -> StreamResult:
    async with target.session() as session:
        return await stream_chat(
            session, target, [{"role": "user", "content": prompt}], max_tokens, ctx.logit_bias
        )


async def at_once(
    ctx: Context, rows: list[Target], prompt_tokens: int, max_tokens: int, tag: str
) -> tuple[list[StreamResult], float]:
    """One fresh prompt per row, all sent at the same moment (each row to its own Target: one
    server, the row's `model` and body); the results and the wall from send to last token."""
    prompts = [ctx.prompt(prompt_tokens, tag) for _ in rows]
    async with rows[0].session() as http:
        t0 = time.monotonic()
        rs = await asyncio.gather(
            *(
                stream_chat(http, t, [{"role": "user", "content": p}], max_tokens, ctx.logit_bias)
                for t, p in zip(rows, prompts)
            )
        )
        return list(rs), time.monotonic() - t0


def _check_length(fig: Figure, res: StreamResult, want: int) -> None:
    """Token rates compare only if both servers made exactly the tokens asked for."""
    if res.completion_tokens != want and "short" not in fig.note:
        fig.note += f"short output: {res.completion_tokens} of {want} tokens. "
