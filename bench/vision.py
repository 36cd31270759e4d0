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
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import report
from .client import BenchError, StreamResult, Target, stream_chat
from .context import Figure, _order, _percentile, filler
from .models import MODEL_CACHE, load_text_tokenizer, no_eos_bias
from .servers import StartError
from .session import SUPERVISOR_ENV, environment
from .vision_setup import (
    BASE,
    COLD,
    HELP,
    NAMES,
    ROOT,
    VisionSizes,
    build_in_child,
    figures,
    openai_parts,
    vlm_parts,
    write_png,
)
from .vision_sides import Baseline, accelerated, start_mlxd


@dataclass
class Bench:
    """One run of everything: the servers, the prompts, the figures as they fill."""

    sz: VisionSizes
    model: Path
    work: Path
    mlxd: Target
    base: Baseline
    notes: list[str]
    figs: dict[str, Figure] = dataclasses.field(init=False)

    def __post_init__(self):
        self.figs = figures(self.sz)
        self.tok = load_text_tokenizer(self.model)
        self.bias = no_eos_bias(self.model)
        self._seed = 1000
        self._nonce = 0
        self._run = os.urandom(3).hex()

    def image(self) -> Path:
        self._seed += 1
        path = self.work / "images" / f"{self._seed}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_png(self._seed, self.sz.image_px, path)

    def question(self, tag: str) -> str:
        self._nonce += 1
        words = filler(self.sz.question, f"{tag}{self._run}-{self._nonce}", self.tok)
        return f"Look at the picture. {words}"

    async def mlxd_chat(self, http, messages, max_tokens: int) -> StreamResult:
        return await stream_chat(http, self.mlxd, messages, max_tokens, self.bias)

    async def warm(self) -> None:
        """Untimed: the model's load, each path's first use (image encode, text prefill)."""
        img, q = self.image(), self.question("warm")
        async with self.mlxd.session() as http:
            for image in (img, None):
                await self.mlxd_chat(http, [{"role": "user", "content": openai_parts(q, image)}], 4)
        for image in (img, None) if self.base.alive else ():
            await self.base.job(
                op="ask", messages=[{"role": "user", "content": vlm_parts(q, image)}],
                images=[str(image)] if image else [], max_tokens=4,
            )  # fmt: skip

    async def turns(self, run: int) -> None:
        """Turn 1 with a fresh image, then turn 2 about it, on both."""
        img, q1, q2 = self.image(), self.question("q1"), self.question("q2")
        # One assistant reply for both (a random model's own replies differ by server, and
        # re-encoded they are not the ids it sampled): the same turn 2 prompt on both sides.
        reply = filler(self.sz.reply, f"reply{self._run}-{run}", self.tok)
        for who in _order(self.sides(), run):
            if who == "mlxd":
                async with self.mlxd.session() as http:
                    msgs = [{"role": "user", "content": openai_parts(q1, img)}]
                    first = await self.mlxd_chat(http, msgs, self.sz.reply)
                    msgs += [
                        {"role": "assistant", "content": reply},
                        {"role": "user", "content": q2},
                    ]
                    second = await self.mlxd_chat(http, msgs, self.sz.reply)
                t1, t2 = first.ttft_s, second.ttft_s
                if second.cached_tokens is not None and second.prompt_tokens:
                    self.figs["hit"].add("mlxd", 100 * second.cached_tokens / second.prompt_tokens)
                self.figs["vs_cold"].add("mlxd", t2)
                self.figs["vs_cold"].add(COLD, t1)
                self._once(
                    "mlxd prompt tokens",
                    f"turn 1 {first.prompt_tokens}, turn 2 {second.prompt_tokens} "
                    f"({second.cached_tokens} cached)",
                )
            else:
                msgs = [{"role": "user", "content": vlm_parts(q1, img)}]
                one = await self.base.job(
                    op="ask", messages=msgs, images=[str(img)], max_tokens=self.sz.reply,
                    state=run,
                )  # fmt: skip
                msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": q2}]
                two = await self.base.job(
                    op="ask", messages=msgs, images=[str(img)], max_tokens=self.sz.reply,
                    state=run,
                )  # fmt: skip
                t1, t2 = one["ttft_s"], two["ttft_s"]
                self._once("mlx-vlm prompt tokens", f"turn 1 {one['prompt_tokens']}, "
                           f"turn 2 {two['prompt_tokens']}")  # fmt: skip
            self.figs["cold"].add(who, t1)
            self.figs["warm"].add(who, t2)

    async def mix(self, run: int) -> None:
        """--clients rows at once on mlxd; the same rows one after another on mlx-vlm."""
        n_img = min(self.sz.image_rows, self.sz.clients)
        rows = [(self.question("mix"), self.image() if i < n_img else None)
                for i in range(self.sz.clients)]  # fmt: skip
        for who in _order(self.sides(), run):
            if who == "mlxd":
                async with self.mlxd.session() as http:
                    t0 = time.monotonic()
                    rs = await asyncio.gather(*(
                        self.mlxd_chat(http, [{"role": "user", "content": openai_parts(q, im)}],
                                       self.sz.mix_tokens)
                        for q, im in rows
                    ))  # fmt: skip
                    wall = time.monotonic() - t0
                ttfts = [r.ttft_s for r in rs]
                tokens = [r.completion_tokens for r in rs]
            else:
                out = await self.base.job(
                    op="mix", max_tokens=self.sz.mix_tokens,
                    rows=[{"messages": [{"role": "user", "content": vlm_parts(q, im)}],
                           "images": [str(im)] if im else []} for q, im in rows],
                )  # fmt: skip
                wall = out["wall_s"]
                ttfts = [r["queued_ttft_s"] for r in out["rows"]]
                tokens = [r["completion_tokens"] for r in out["rows"]]
            short = [t for t in tokens if t != self.sz.mix_tokens]
            if short:
                self._once(f"{who} short", f"outputs {short} of {self.sz.mix_tokens} tokens")
            got = {
                "wall": wall,
                "agg": sum(tokens) / wall,
                "p50": _percentile(ttfts, 0.5),
                "p90": _percentile(ttfts, 0.9),
            }
            if n_img:
                got["img50"] = _percentile(ttfts[:n_img], 0.5)
            if n_img < len(ttfts):
                got["txt50"] = _percentile(ttfts[n_img:], 0.5)
            for key, value in got.items():
                self.figs[key].add(who, value)

    def sides(self) -> list[str]:
        """mlxd, and mlx-vlm while its process lives (mlxd's figures go on without it)."""
        return ["mlxd", BASE] if self.base.alive else ["mlxd"]

    def _once(self, key: str, text: str) -> None:
        if not any(n.startswith(key) for n in self.notes):
            self.notes.append(f"{key}: {text}")


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
