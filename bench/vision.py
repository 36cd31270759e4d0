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
import base64
import dataclasses
import datetime as dt
import json
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
from .models import MODEL_CACHE, alias_model, load_text_tokenizer, no_eos_bias
from .servers import (
    StartError,
    _die_with_parent,
    start_supervisor,
    start_worker,
    supervisor_available,
)
from .session import SUPERVISOR_ENV, environment

ROOT = Path(__file__).resolve().parents[1]
MODEL = "bench-vlm"
BASE = "mlx_vlm"
COLD = "mlxd_turn1"  # mlxd's own turn 1 beside its turn 2, paired by run
_MARKER = ".bench-vlm.json"  # written last: a folder without it is an interrupted build

# google/gemma-3-4b-it's sizes: the text model (5 sliding-window layers of 1,024 tokens to 1
# global), the SigLIP tower at 896 px (4,096 patches of 14 px, pooled to 256 image tokens).
# The vocabulary is the real one, so the LM head (tied to the embeddings) costs what it costs;
# the tokenizer is tests/tiny_vlm.py's BPE padded to that many ids.
SHAPES: dict[str, dict] = {
    "gemma3-4b": {
        "text": {
            "hidden_size": 2560,
            "num_hidden_layers": 34,
            "intermediate_size": 10240,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "query_pre_attn_scalar": 256,
            "sliding_window": 1024,
            "sliding_window_pattern": 6,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "max_position_embeddings": 131072,
            "mm_tokens_per_image": 256,
        },
        "vision": {
            "hidden_size": 1152,
            "num_hidden_layers": 27,
            "num_attention_heads": 16,
            "intermediate_size": 4304,
            "image_size": 896,
            "patch_size": 14,
        },
        "top": {"mm_tokens_per_image": 256},
        "vocab_size": 262208,
        "dtype": "bfloat16",
    },
}
NAMES = ("tiny", *SHAPES)  # tiny: tests/tiny_vlm.py's gemma3 as it is (32 px, 4 image tokens)


@dataclass(frozen=True)
class VisionSizes:
    """How big each part is (the CLI's flags)."""

    repeats: int = 3
    image_px: int = 1024  # the PNGs sent, a side (the processor resizes them)
    question: int = 200  # tokens of each question
    reply: int = 16  # tokens out per turn
    clients: int = 8
    image_rows: int = 4  # of the clients, rows with an image
    mix_tokens: int = 64


HELP = {
    "image_px": "side of each PNG sent, pixels",
    "question": "tokens of each question",
    "reply": "turns: tokens out per turn",
    "clients": "mix: requests at once",
    "image_rows": "mix: how many of them carry an image",
    "mix_tokens": "mix: tokens out per request",
}


def build(shape: str, dest: Path, seed: int = 0) -> Path:
    """Write the random-weight VLM folder of `shape` at `dest` (reused when complete). The
    large shapes are drawn by MLX on the default device, bf16, written shard by shard."""
    marker = dest / _MARKER
    want = {"shape": shape, "seed": seed, "format": 1}
    if marker.exists() and json.loads(marker.read_text()) == want:
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    from .models import _write_shards, tests_module

    builder = tests_module("tiny_vlm").build_vlm
    if shape == "tiny":
        builder(dest, "gemma3", seed)
    else:
        builder(dest, "gemma3", seed, sizes=SHAPES[shape], write_weights=_write_shards)
    marker.write_text(json.dumps(want))
    return dest


def build_in_child(shape: str, dest: Path) -> Path:
    """build() in a fresh interpreter: the bench process never holds MLX or its buffers."""
    code = "import sys; from pathlib import Path; from bench.vision import build; "
    code += "build(sys.argv[1], Path(sys.argv[2]))"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", code, shape, str(dest)], check=True, cwd=ROOT)
    print(f"model ready in {time.monotonic() - t0:.0f}s: {dest}", flush=True)
    return dest


def write_png(seed: int, px: int, dest: Path) -> Path:
    """A deterministic px×px PNG of random pixels (each seed its own image: no cache hits)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.RandomState(seed).randint(0, 256, (px, px, 3), dtype=np.uint8)
    Image.fromarray(pixels, "RGB").save(dest, format="PNG")
    return dest


def openai_parts(text: str, image: Path | None) -> list[dict] | str:
    """A user message's content: the image as a data: URL first, then the text."""
    if image is None:
        return text
    url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]


def vlm_parts(text: str, image: Path | None) -> list[dict] | str:
    """The same content as mlx-vlm's chat template takes it (the image passed by path)."""
    return text if image is None else [{"type": "image"}, {"type": "text", "text": text}]


class Baseline:
    """mlx-vlm's generator in its own process (bench/vision_baseline.py), job by job."""

    def __init__(self, model: Path, log: Path):
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as err:  # the child holds its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench.vision_baseline", str(model)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=ROOT,
                text=True,
                env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"},
                preexec_fn=_die_with_parent,  # no orphan holding the GPU if the bench is killed
            )
        self.log = log

    async def _line(self) -> dict:
        line = await asyncio.to_thread(self.proc.stdout.readline)
        if not line:
            tail = self.log.read_text(errors="replace").splitlines()[-2:]
            raise BenchError("mlx-vlm baseline exited:\n" + "\n".join(tail))
        answer = json.loads(line)
        if "error" in answer:
            raise BenchError(f"mlx-vlm baseline: {answer['error']}")
        return answer

    async def ready(self) -> None:
        await self._line()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    async def job(self, **job) -> dict:
        try:
            self.proc.stdin.write(json.dumps(job, default=str) + "\n")
            self.proc.stdin.flush()
        except OSError as exc:  # it exited: its log says why
            raise BenchError(f"mlx-vlm baseline gone ({exc}); see {self.log}") from exc
        return await self._line()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def figures(sz: VisionSizes) -> dict[str, Figure]:
    """Every figure of the run, mlxd against mlx-vlm unless said otherwise."""
    img = f"{sz.image_px}² image + {sz.question} tok"
    mix = f"mix ×{sz.clients} ({sz.image_rows} image, {sz.clients - sz.image_rows} text)"
    f = lambda workload, metric, unit, hib, **kw: Figure(  # noqa: E731
        workload, metric, unit, hib, base=BASE, **kw
    )
    return {
        "cold": f("image turn 1", f"TTFT, new {img}", "s", False),
        "warm": f(
            "image turn 2",
            f"TTFT, same image, new {sz.question} tok question",
            "s",
            False,
            note="mlx-vlm: with its own PromptCacheState carried from turn 1.",
        ),
        "hit": Figure("image turn 2", "prompt from cache", "%", True, base=""),
        "vs_cold": Figure(
            "image turn 2", "mlxd TTFT turn 2 / turn 1", "s", False, base=COLD, paired=True
        ),
        "wall": f(mix, f"wall ({sz.mix_tokens} tok out each)", "s", False),
        "agg": f(mix, "aggregate output tok/s", "tok/s", True),
        "p50": f(mix, "TTFT p50, all rows", "s", False),
        "p90": f(mix, "TTFT p90, all rows", "s", False),
        "img50": f(mix, "TTFT p50, image rows", "s", False),
        "txt50": f(mix, "TTFT p50, text rows", "s", False),
    }


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


async def start_mlxd(model: Path, work: Path, logs: Path) -> tuple[list, Target, str]:
    """`mlxd start` serving the model (else one worker on its socket); its target, and how."""
    ok, why = supervisor_available()
    if ok:
        home = work / "home"
        alias_model(model, home / "models" / MODEL)
        try:
            sup = await start_supervisor(home, MODEL, logs, SUPERVISOR_ENV)
            return [sup], sup.target, "supervisor over TCP (`mlxd start`)"
        except StartError as exc:
            why = str(exc).splitlines()[0][:200]
    w = await start_worker(model, MODEL, work / "w.sock", logs)
    target = dataclasses.replace(w.target, name="mlxd", label="mlxd worker (UNIX socket)")
    return [w], target, f"worker UNIX socket directly: supervisor unavailable ({why})"


def accelerated() -> bool:
    """Whether MLX's default device here is a GPU (asked in a child: no MLX here)."""
    code = "import mlx.core as mx; print(mx.default_device().type == mx.DeviceType.gpu)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return r.stdout.strip() == "True"


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
