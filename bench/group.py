"""`python -m bench group`: a worker group of 2 ranks beside the same model in one process.

    python -m bench group                         # the tiny random model, on this machine
    python -m bench group --shape qwen3-0.6b --tokens 256 --levels 1,8
    python -m bench group --model ~/models/Qwen3-8B-4bit --ranks 2
    python -m bench group --shape qwen3-8b --backend nccl --levels 1,8,32 --ttft-tokens 8192

One `mlxd start` serves the model twice: `single` (one worker) and `group` (`group_size =
--ranks`, over --backend: ring on loopback, or nccl with one GPU per rank). Both are driven
through the supervisor with the same streamed greedy requests (EOS forbidden, so every row
decodes exactly --tokens); the figures are the median per-stream decode rate and the aggregate
rate at each concurrency level, whether the group's greedy text equals the single worker's,
and with --ttft-tokens the time to first token of a cold prompt of that size. On one machine
with the ring this measures the group's correctness and overhead (two ranks share one host's
cores and memory bandwidth, and every projection is an all_sum over loopback), not a speed-up.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from .client import BenchError, Target, stream_chat
from .context import filler
from .models import (
    SHAPE_NAMES,
    alias_model,
    build_model,
    cached_model,
    load_text_tokenizer,
    no_eos_bias,
)
from .servers import StartError, start_supervisor

PROMPT = "Write a long story about a lighthouse keeper and the sea, with many details."


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench group", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="mlx-lm model folder (default: --shape's)")
    p.add_argument("--shape", default="tiny", help=f"one of {', '.join(SHAPE_NAMES)}")
    p.add_argument("--ranks", type=int, default=2, help="group_size of the group (default 2)")
    p.add_argument("--tokens", type=int, default=128, help="tokens decoded per request")
    p.add_argument("--levels", default="1,4", help="concurrent streams, e.g. 1,4")
    p.add_argument("--repeats", type=int, default=3, help="runs per figure (median)")
    p.add_argument("--backend", choices=("ring", "nccl"), default="ring", help="the group's")
    p.add_argument(
        "--ttft-tokens", type=int, default=0, help="a cold prompt's size for TTFT (0: none)"
    )
    p.add_argument("--out", type=Path, help="also write the table to this file")
    return p.parse_args(argv)


async def _level(target: Target, n: int, tokens: int, bias: dict, repeats: int) -> dict:
    """Median per-stream and aggregate decode tok/s of `n` concurrent streams."""
    per, agg, texts = [], [], []
    async with target.session() as s:
        for _ in range(repeats):
            t0 = time.monotonic()
            rs = await asyncio.gather(
                *(
                    stream_chat(s, target, [{"role": "user", "content": PROMPT}], tokens, bias)
                    for _ in range(n)
                )
            )
            wall = time.monotonic() - t0
            per.append(statistics.median(r.decode_tps for r in rs))
            agg.append(sum(r.completion_tokens for r in rs) / wall)
            texts.append(rs[0].text)
    return {"per": statistics.median(per), "agg": statistics.median(agg), "text": texts[0]}


async def _cold_ttft(target: Target, n_tokens: int, tokenizer, repeats: int) -> float:
    """Median seconds to the first token of a prompt of `n_tokens` no cache has seen."""
    out = []
    async with target.session() as s:
        for _ in range(repeats):
            text = filler(n_tokens, f"{target.model}-{os.urandom(4).hex()}", tokenizer)
            res = await stream_chat(s, target, [{"role": "user", "content": text}], 1)
            out.append(res.ttft_s)
    return statistics.median(out)


async def run(a: argparse.Namespace, work: Path) -> str:
    if a.model:
        model = a.model.resolve()
    elif a.shape == "tiny":
        model = build_model(a.shape, work / "models" / a.shape)
    else:  # the larger shapes take minutes to write: kept between runs
        model = cached_model(a.shape)
    home = work / "home"
    (home / "models").mkdir(parents=True)
    alias_model(model, home / "models" / "single")
    alias_model(model, home / "models" / "group")
    (home / "config.toml").write_text(
        "keep_alive_s = -1\nssd_cache = false\n[models.group]\n"
        f'group_size = {a.ranks}\nbackend = "{a.backend}"\n'
    )
    sup = await start_supervisor(home, "single", work / "logs")
    levels = [int(x) for x in a.levels.split(",") if x.strip()]
    bias = no_eos_bias(model)
    rows = []
    try:
        figures: dict[str, dict[int, dict]] = {}
        ttft: dict[str, float] = {}
        tokenizer = load_text_tokenizer(model)
        for name in ("single", "group"):
            t = Target("mlxd", name, sup.target.base_url, model=name)
            await _level(t, 1, 8, bias, 1)  # load and warm up
            figures[name] = {n: await _level(t, n, a.tokens, bias, a.repeats) for n in levels}
            if a.ttft_tokens:
                ttft[name] = await _cold_ttft(t, a.ttft_tokens, tokenizer, a.repeats)
        for n in levels:
            one, grp = figures["single"][n], figures["group"][n]
            same = "yes" if one["text"] == grp["text"] else "no"
            rows.append(
                f"| {n} | {one['per']:.1f} | {grp['per']:.1f} | {grp['per'] / one['per']:.2f} "
                f"| {one['agg']:.1f} | {grp['agg']:.1f} | {same} |"
            )
        if ttft:
            one, grp = ttft["single"], ttft["group"]
            rows.append(
                f"\nTTFT of a cold {a.ttft_tokens}-token prompt (median of {a.repeats}): "
                f"single {one * 1000:.0f} ms, group {grp * 1000:.0f} ms, group / single "
                f"{grp / one:.2f}"
            )
    finally:
        sup.terminate(30)
    how = "ring, loopback" if a.backend == "ring" else "nccl, one GPU per rank"
    head = (
        f"model {a.model or 'random-weight ' + a.shape}, group of {a.ranks} ({how}) vs "
        f"one process, {a.tokens} tokens per stream, greedy, median of {a.repeats}; "
        f"{platform.machine()} {platform.system()}, Python {platform.python_version()}\n\n"
        "| streams | single tok/s per stream | group tok/s per stream | group / single "
        "| single tok/s total | group tok/s total | same greedy text |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    return head + "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mlxd-bench-group-"))
    try:
        md = asyncio.run(run(a, work))
    except (StartError, BenchError) as exc:  # no server, or a model that did not load
        print(f"benchmark aborted: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(md)
    if a.out:
        a.out.write_text(md)
    return 0
