"""`python -m bench steps FILE`: summarise a worker's step log (MLXD_STEP_LOG, see
docs/operations.md): where the engine's time went, by kind of step, and the slowest steps.

    MLXD_STEP_LOG=/tmp/steps.jsonl bash bench/gpu_run.sh --only concurrency --levels 8
    python -m bench steps /tmp/steps.jsonl
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

import orjson

from .context import _percentile

KINDS = ("decode", "prefill", "mixed", "empty", "failed")


def kind(step: dict) -> str:
    """decode: only decoding rows; prefill: only prefilling ones; mixed: both; failed: the
    step raised (out of memory, ...) and its batch was rebuilt."""
    if step.get("failed"):
        return "failed"
    pre, dec = step["prefill_rows"] > 0, step["decoded"] > 0
    if pre and dec:
        return "mixed"
    return "prefill" if pre else "decode" if dec else "empty"


def segments(steps: list[dict]) -> list[list[dict]]:
    """The log split by worker run: each process's own lines (older logs without a pid: a
    run's steps count from 1 again after a restart or reload)."""
    runs: dict[object, list[dict]] = {}
    n = 0
    for s in steps:
        if "pid" not in s and n in runs and s["step"] < runs[n][-1]["step"]:
            n += 1
        runs.setdefault(s.get("pid", n), []).append(s)
    return list(runs.values())


def read(path: Path) -> list[dict]:
    steps = []
    for line in path.read_bytes().splitlines():
        if line.strip():
            steps.append(orjson.loads(line))
    return steps


def summary(steps: list[dict], slowest: int = 12) -> str:
    """A markdown summary: per kind, steps, total and median/p95/max seconds, prefill tokens;
    then the slowest steps."""
    by: dict[str, list[dict]] = defaultdict(list)
    for s in steps:
        by[kind(s)].append(s)
    peak = max((s.get("peak_mb", 0) for s in steps), default=0)
    runs = segments(steps)
    wall = sum(r[-1]["t"] + r[-1]["s"] - r[0]["t"] for r in runs)
    busy = sum(s["s"] for s in steps)
    out = [
        f"{len(steps)} steps of {len(runs)} worker run(s) over {wall:.2f} s, {busy:.2f} s of "
        f"them in steps ({busy / wall:.0%} busy); MLX's peak memory {peak} MiB"
        if wall
        else "no steps",
        "",
        "| kind | steps | seconds | median ms | p95 ms | max ms | prefill tokens | tok/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for k in KINDS:
        group = by.get(k)
        if not group:
            continue
        secs = sorted(s["s"] for s in group)
        total = sum(secs)
        tokens = sum(s["prefill_tokens"] for s in group)
        p95 = _percentile(secs, 0.95)
        rate = f"{tokens / total:.0f}" if tokens and total else ""
        out.append(
            f"| {k} | {len(group)} | {total:.2f} | {statistics.median(secs) * 1e3:.1f} | "
            f"{p95 * 1e3:.1f} | {secs[-1] * 1e3:.1f} | {tokens} | {rate} |"
        )
    out += [
        "",
        f"Slowest {slowest} steps:",
        "",
        "| step | t s | ms | chunk | prefill rows | prefill tokens | decoded | admitted | queued "
        "| peak MiB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in sorted(steps, key=lambda s: s["s"], reverse=True)[:slowest]:
        out.append(
            f"| {s['step']} | {s['t']:.3f} | {s['s'] * 1e3:.1f} | {s['chunk']} | "
            f"{s['prefill_rows']} | {s['prefill_tokens']} | {s['decoded']} | {s['admitted']} | "
            f"{s['queued']} | {s.get('peak_mb', '')} |"
        )
    return "\n".join(out)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench steps", description=__doc__.splitlines()[0])
    p.add_argument("file", type=Path, help="a step log (MLXD_STEP_LOG)")
    p.add_argument("--slowest", type=int, default=12, help="how many of the slowest steps")
    a = p.parse_args(argv)
    print(summary(read(a.file), a.slowest))
    return 0
