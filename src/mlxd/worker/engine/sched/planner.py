"""Prefill planning: how many prompt tokens each prefilling row gets in the coming step.

Pure (no MLX), so its rules are unit-tested alone. mlx-lm's BatchGenerator prefills every row
of its prompt batch by the same chunk in one right-padded forward, so a step costs about
`rows x chunk` prompt tokens, padding included; the plan is that one chunk size:

- idle (nothing decodes, and no new row waits behind a running prefill): large chunks, the
  idle chunk (a prompt shorter than that is prefilled whole), for few forwards and syncs;
- busy (rows decode, or a new row joins a prefill already running): the step budget, so every
  decoding row gets its token each step after a bounded prefill, and a short newcomer is
  prefilled in the step it is admitted instead of waiting behind the long prompt.

The budget is shared among the prefilling rows (right padding makes every row cost the
longest chunk), never below `min_chunk` each so a crowded step still makes progress. With a
step-time target (`step_target_s`), a busy step's budget is also at most what the measured
prefill pace (PrefillPace: tokens per second of recent steps that prefilled) does in that
time: on a CPU, or a large model on a Mac, a 512-token chunk deep in a long prompt takes
seconds, and every decoding row waits that long for each token. With a
prefill `block` (worker/model/blocks.py, CUDA) the chunk is whole blocks: rounded up, so a
step may pass its budget by less than a block a row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxd.worker.model.blocks import round_up

# The smallest share of a crowded step's budget a prefilling row gets, in tokens.
MIN_CHUNK = 64
SMALL_CHUNK = 16  # the warm-up's prefill chunk on the CPU


# The smallest window that sets a model's default prefill chunk (window_chunk).
WINDOW_CHUNK_FLOOR = 1024


def window_chunk(default: int, window: int) -> int:
    """The default prefill chunk for a model with sliding-window layers of `window` tokens
    (0: none): the window, when it is at least WINDOW_CHUNK_FLOOR and below `default`. A
    window layer's chunk of C queries attends over C + window keys, so a prompt of N tokens
    costs it N x (C + window) scores: gemma3-12b's 16k prompt on an H100 (docs/benchmarks.md,
    2026-12-07 05:33) took 1.91 s at 4,096-token chunks (window layers 0.81 s of it, 59.7 GiB
    peak) and 1.68 s at 1,024 (31.7 GiB peak). Smaller windows (gpt-oss: 128) keep the
    default: their window layers cost little, and a smaller chunk would feed each expert of a
    MoE fewer tokens per step (not measured)."""
    return min(default, window) if window >= WINDOW_CHUNK_FLOOR else default


@dataclass(frozen=True)
class PlanConfig:
    """Prefill sizes in tokens: `idle_chunk` when nothing decodes, `step_budget` otherwise."""

    idle_chunk: int = 4096
    step_budget: int = 1024
    min_chunk: int = MIN_CHUNK
    block: int = 0  # chunks in whole blocks of this many tokens (0: any size)
    step_target_s: float = 0.0  # a busy step's wall-time target (0: none; PrefillPace)

    def __post_init__(self):
        if not 1 <= self.min_chunk <= self.step_budget:
            raise ValueError("min_chunk must be between 1 and step_budget")
        if self.idle_chunk < 1:
            raise ValueError("idle_chunk must be at least 1")


@dataclass(frozen=True)
class Prefilling:
    """The planner's view of one row with prompt tokens left to prefill."""

    todo: int  # prompt tokens still to prefill (the last one goes with the first decode)
    started: bool  # it has had a chunk already (False: admitted for this step)


def is_busy(decoding: int, rows: Sequence[Prefilling]) -> bool:
    """Whether the step must stay short: rows decode, or a newcomer joins a running prefill."""
    if decoding > 0:
        return True
    return any(r.started for r in rows) and any(not r.started for r in rows)


def plan_chunk(
    decoding: int, rows: Sequence[Prefilling], cfg: PlanConfig, paced: int | None = None
) -> int:
    """The prefill chunk, in tokens per row, for a step with `decoding` rows decoding and
    `rows` still prefilling (rows with nothing left to prefill are not counted). `paced`:
    the tokens a step prefills in `cfg.step_target_s` at the measured pace (None: unknown,
    or no target), a bound on a busy step's budget."""
    rows = [r for r in rows if r.todo > 0]
    if not rows:
        return cfg.idle_chunk
    busy = is_busy(decoding, rows)
    budget = cfg.step_budget if busy else cfg.idle_chunk
    if busy and paced is not None:
        budget = min(budget, paced)
    # The longest row's need caps the chunk: a larger one would only be padding.
    need = max(r.todo for r in rows)
    return round_up(max(1, min(need, max(budget // len(rows), cfg.min_chunk))), cfg.block)


class PrefillPace:
    """Prompt tokens per second of the steps that prefilled, as a moving average, so a busy
    step can be sized to a wall-time target. A step's seconds include its decoding rows'
    share, so the pace is that of steps like it, and a step planned from it lands near the
    target. Pure: the engine reports each step (tokens, seconds), measured by its clock."""

    WEIGHT = 0.3  # of the latest step: a prompt's chunks slow down as its context grows

    def __init__(self) -> None:
        self.tokens_per_s: float | None = None

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        rate = tokens / seconds
        old = self.tokens_per_s
        self.tokens_per_s = rate if old is None else old + self.WEIGHT * (rate - old)

    def tokens_in(self, target_s: float) -> int | None:
        """Prompt tokens a step prefills in `target_s` (None: no target, or no step yet)."""
        if target_s <= 0 or self.tokens_per_s is None:
            return None
        return max(1, int(self.tokens_per_s * target_s))


# The largest prefill chunk a warm-up runs: its cost is bounded whatever the model's size.
WARMUP_MAX_CHUNK = 512


def warmup_shapes(
    cfg: PlanConfig, batch: int, context_limit: int, small: bool
) -> tuple[list[int], list[int]]:
    """(prefill chunk sizes, decode batch sizes) a warm-up runs once before READY.

    The chunks the planner uses (idle, budget, the smallest), at most a quarter of the
    context and at most WARMUP_MAX_CHUNK (a warm-up of 4096-token chunks on a 70B model would
    take minutes of its load timeout), and decode batches 1, 2, 4, ... up to `batch`.
    `small` (the CPU: no GPU kernels to compile, and every token costs real time) runs one
    16-token chunk and decode batches 1 and 2: the same code paths, once, cheaply.
    """
    if small:
        return [min(SMALL_CHUNK, cfg.min_chunk)], sorted({1, min(2, batch)})
    cap = max(1, min(context_limit // 4, WARMUP_MAX_CHUNK))
    sizes = {cfg.idle_chunk, cfg.step_budget, cfg.min_chunk}
    chunks = sorted({min(c, cap) for c in sizes}, reverse=True)
    buckets, b = [], 1
    while b < batch:
        buckets.append(b)
        b *= 2
    return chunks, [*buckets, batch]
