"""`python -m bench vision`: images through mlxd (issue 35) against mlx-vlm's own generate.

    python -m bench vision --shape tiny --out /tmp/vb      # CPU smoke, ~1 min
    python -m bench vision --shape gemma3-4b               # H200 (bench/h200.sh vision)

One mlxd (`mlxd start`) serves a random-weight VLM; requests go through the OpenAI chat API
with the image as an `image_url` data: URL (PNG). The yardstick is mlx-vlm's generator in a
process of its own (bench/vision_baseline.py), on the same PNG files and chats, alternated
with mlxd run by run.

turns, per run: a fresh --image-px² image with a --question-token question (turn 1: the image
is new to both, a cold TTFT), then the conversation's second turn, the same image and a new
question (mlxd: the image's prefix from its prompt cache, nothing encoded; mlx-vlm: its own
PromptCacheState, the multi-turn reuse its chat keeps). Both make --reply tokens a turn; turn
2 carries one fixed --reply-token assistant message, so both sides get the same prompt.
mix, per run: --clients requests at once, --image-rows of them with a fresh image each, the
rest text only, --question tokens each and --mix-tokens out (stop tokens forbidden): wall,
TTFT p50/p90 over the rows, aggregate output tok/s. mlx-vlm's generate has no batching: its
rows go one after another, each row's TTFT counted from the mix's start (what clients
arriving together would wait).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from . import report
from .client import BenchError
from .models import MODEL_CACHE
from .servers import StartError
from .session import SUPERVISOR_ENV, environment
from .vision_parts import Bench
from .vision_setup import (
    HELP,
    NAMES,
    ROOT,
    VisionSizes,
    build_in_child,
)
from .vision_sides import Baseline, accelerated, start_mlxd


async def run(a, sz: VisionSizes, model: Path, label: str, work: Path, out: Path) -> str:
    """Start both sides, warm them, run the parts run by run; the report after each run."""
    logs, notes, servers, base = out / "logs", [], [], None
    meta = {
        **environment(accelerated()),
        "model": label,
        "mlxd_target": "",
        "servers_text": "mlxd on its defaults (supervisor env "
        + " ".join(f"{k}={v}" for k, v in SUPERVISOR_ENV.items())
        + "); mlx-vlm's stream_generate in its own process",
        "sizes_text": (
            f"{sz.repeats} runs; turns: {sz.image_px}² PNG + {sz.question} tok, {sz.reply} tok "
            f"out; mix: {sz.clients} at once ({sz.image_rows} with an image) × "
            f"{sz.question}+{sz.mix_tokens} tok"
        ),
        "notes": notes,
    }
    try:
        import importlib.metadata as md

        notes.append(f"mlx-vlm {md.version('mlx-vlm')}")
    except Exception:  # noqa: BLE001 — a version string only
        pass
    bench = None
    try:
        base = Baseline(model, logs / "mlx_vlm.log")
        servers, target, how = await start_mlxd(model, work, logs)
        meta["mlxd_target"] = how
        try:
            await base.ready()
        except BenchError as exc:  # mlx-vlm missing or broken: mlxd's figures alone
            notes.append(f"no mlx-vlm baseline: {exc}")
            print(f"  {exc}", file=sys.stderr, flush=True)
        bench = Bench(sz, model, work, target, base, notes)
        print(f"[{dt.datetime.now():%H:%M:%S}] warm-up (loads the model) ...", flush=True)
        await bench.warm()
        for i in range(sz.repeats):
            for name in (a.only or "turns,mix").split(","):
                print(f"[{dt.datetime.now():%H:%M:%S}] {name} run {i + 1} ...", flush=True)
                try:
                    await getattr(bench, name)(i)
                except BenchError as exc:  # the other parts' figures still count
                    notes.append(f"{name} run {i + 1}: failed: {exc}")
                    print(f"  failed: {exc}", file=sys.stderr, flush=True)
            _write(out, bench, meta)
    finally:
        if base is not None:
            base.stop()
        for s in servers:
            s.terminate()
        home_logs = work / "home" / "logs"
        if home_logs.is_dir():
            shutil.copytree(home_logs, logs / "supervisor-home", dirs_exist_ok=True)
    return _write(out, bench, meta) if bench else ""


def _write(out: Path, bench, meta: dict) -> str:
    meta["date"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    figs = [f for f in bench.figs.values() if f.samples]
    md, _ = report.write(out, figs, meta)
    return md


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through the `finally` that stops the servers


def main(argv: list[str]) -> int:
    d = VisionSizes()
    p = argparse.ArgumentParser(prog="python -m bench vision", description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="tiny", choices=NAMES, help="random-weight VLM to build")
    p.add_argument("--model", type=Path, help="a VLM folder instead (gemma3 / mistral3)")
    p.add_argument("--repeats", type=int, default=d.repeats, help="runs per figure (median)")
    p.add_argument("--out", type=Path, help="results folder (results.md, results.json, logs/)")
    p.add_argument("--only", help="parts, in order: turns,mix")
    p.add_argument("--models-dir", type=Path, help=f"built models (default {MODEL_CACHE})")
    for name, what in HELP.items():
        p.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name), help=what)
    a = p.parse_args(argv)
    if a.only and not set(a.only.split(",")) <= {"turns", "mix"}:
        p.error("--only: turns, mix")
    sz = VisionSizes(**{f.name: getattr(a, f.name) for f in dataclasses.fields(VisionSizes)})
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = a.out or ROOT / "bench" / "results" / f"vision-{stamp}"
    work = Path(tempfile.mkdtemp(prefix="mlxd-vb-"))  # short: UNIX socket paths
    try:
        if a.model:
            model, label = a.model.resolve(), str(a.model)
        else:
            cache = a.models_dir or (work / "models" if a.shape == "tiny" else MODEL_CACHE)
            print(f"building {a.shape} random-weight VLM in {cache} ...", flush=True)
            model = build_in_child(a.shape, cache / f"vlm-{a.shape}")
            label = f"random-weight {a.shape} VLM"
        md = asyncio.run(run(a, sz, model, label, work, out))
    except (StartError, BenchError, subprocess.CalledProcessError) as exc:
        print(f"benchmark aborted: {exc}\nlogs: {out}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n" + md + f"\nresults: {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
