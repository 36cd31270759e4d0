"""`python -m bench run`: mlxd and mlx_lm.server side by side on the same model folder.

    python -m bench run --quick                      # tiny random model, a few minutes on CPU
    python -m bench kvquant                          # KV bytes, tok/s, agreement per kv_bits
    python -m bench run --model ~/models/Qwen3-8B    # a real model folder
    python -m bench run --shape qwen3-8b --only single,concurrency
    python -m bench profile --shape qwen3-8b --batches 1,8,32   # where a decode step goes
    python -m bench speculative --builtin            # prompt lookup on the built-in model
    python -m bench group                            # a worker group of 2 vs one process
    python -m bench steps /tmp/steps.jsonl           # a worker's step log (MLXD_STEP_LOG)
    python -m bench attention --shape qwen3-0.6b     # first use of attention shapes (CUDA)
    python -m bench masks --shape qwen3-8b           # a long prefill by attention path
    python -m bench extend --shape qwen3-8b          # rows extending a cached prefix, in process
    python -m bench agents --shape qwen3-0.6b        # K agent sessions sharing a prefix; a burst
    python -m bench claude --shape qwen3-8b          # Claude-Code-shaped sessions, 2 in a row
    python -m bench families --shape gemma3-12b      # a sliding-window / hybrid model (issue 34)
    python -m bench adapters --shape qwen3-8b        # 32 clients over 1/4/16 LoRA adapters (36)
    python -m bench vision --shape gemma3-4b         # images: TTFT, 2nd turn, a mix vs mlx-vlm (35)
    python -m bench cpu_blas                         # CPU decode: bundled BLAS vs OpenBLAS (Linux)

See docs/benchmarks.md for what each workload measures and the goals.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from . import context, report, workloads
from .client import BenchError
from .models import (
    MODEL_CACHE,
    SHAPE_NAMES,
    alias_model,
    build_model,
    load_text_tokenizer,
    no_eos_bias,
)
from .servers import StartError
from .session import Session, environment

ROOT = Path(__file__).resolve().parents[1]
# Commands that are a module of their own (bench/<name>.py, with a `main(argv)`), and MLX
# only in the processes they start or in that module.
STANDALONE = (
    "kvquant", "profile", "speculative", "extend", "masks", "attention", "steps", "group",
    "agents", "claude", "families", "adapters", "vision", "cpu_blas",
)  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("profile", help="split a decode step's time (bench/profile.py)", add_help=False)
    sub.add_parser("speculative", help="decode with and without drafts", add_help=False)
    sub.add_parser("attention", help="attention shapes' first use", add_help=False)
    sub.add_parser("masks", help="a long prefill by attention path", add_help=False)
    sub.add_parser("extend", help="rows extending a cached prefix (in process)", add_help=False)
    sub.add_parser("steps", help="summarise a worker's step log (bench/steps.py)", add_help=False)
    sub.add_parser("agents", help="agent sessions sharing a prefix; a burst", add_help=False)
    sub.add_parser("claude", help="Claude-Code-shaped sessions (bench/claude.py)", add_help=False)
    sub.add_parser("families", help="sliding-window and hybrid models", add_help=False)
    sub.add_parser("adapters", help="clients over many LoRA adapters vs base", add_help=False)
    sub.add_parser("vision", help="image requests vs mlx-vlm's generate", add_help=False)
    sub.add_parser("cpu_blas", help="CPU decode: bundled BLAS vs OpenBLAS", add_help=False)
    r = sub.add_parser("run", help="run the side-by-side benchmark")
    r.add_argument(
        "--model", type=Path, help="mlx-lm model folder (default: a random model built for --shape)"
    )
    r.add_argument(
        "--model-b",
        type=Path,
        help="second model folder for the swap workload "
        "(default: the same files under another name)",
    )
    r.add_argument(
        "--shape",
        help="random-weight model shape(s) to build when --model is not "
        f"given, comma-separated: {', '.join(SHAPE_NAMES)} (default: tiny on CPU "
        "or with --quick, else qwen3-0.6b,qwen3-8b)",
    )
    r.add_argument("--quick", action="store_true", help="small prompts and outputs, 3 runs")
    r.add_argument("--repeats", type=int, help="runs per figure (median is reported; min 3)")
    ints = lambda v: tuple(int(x) for x in v.split(",") if x.strip())  # noqa: E731
    r.add_argument("--levels", type=ints, help="concurrency levels, e.g. 1,8,16,32")
    r.add_argument("--long-prompts", type=ints, help="longprompt sizes in tokens, e.g. 2048,8192")
    r.add_argument(
        "--exclusive",
        action="store_true",
        help="longprompt: unload mlxd's model during mlx_lm.server's turns (one server's "
        "prefills on the device at a time)",
    )
    r.add_argument("--only", help="comma-separated workloads: " + ",".join(workloads.WORKLOADS))
    r.add_argument("--out", type=Path, help="results folder (default bench/results/<time>/)")
    r.add_argument(
        "--models-dir",
        type=Path,
        help="where built models are kept (default: a "
        "temp dir for tiny, ~/.cache/mlxd-bench/models for the others)",
    )
    sub.add_parser("kvquant", help="KV schemes side by side (bench/kvquant.py)", add_help=False)
    a = p.parse_args(argv)
    a.only = _pick_workloads(p, a.only)
    if a.repeats is not None and a.repeats < 3:
        p.error("--repeats must be at least 3 (figures are medians of runs)")
    if a.model and a.shape:
        p.error("give --model or --shape, not both")
    return a


def _pick_workloads(p: argparse.ArgumentParser, only: str | None) -> list[str]:
    if not only:
        return list(workloads.WORKLOADS)
    picked = [w.strip() for w in only.split(",") if w.strip()]
    unknown = sorted(set(picked) - set(workloads.WORKLOADS))
    if unknown:
        p.error(
            f"unknown workload(s) {', '.join(unknown)}; choose from "
            f"{', '.join(workloads.WORKLOADS)}"
        )
    # Canonical order: swap runs last because it evicts the model the others use.
    return [w for w in workloads.WORKLOADS if w in picked]


def _accelerated() -> bool:
    """Whether MLX's default device here is a GPU (asked in a child: no MLX in this process)."""
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import mlx.core as mx; print(mx.default_device().type == mx.DeviceType.gpu)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r.stdout.strip() == "True"


def _shapes(a: argparse.Namespace, gpu: bool) -> list[str]:
    if a.shape:
        shapes = [s.strip() for s in a.shape.split(",") if s.strip()]
        bad = [s for s in shapes if s not in SHAPE_NAMES]
        if bad:
            sys.exit(f"unknown shape(s) {', '.join(bad)}; choose from {', '.join(SHAPE_NAMES)}")
        return shapes
    return ["qwen3-0.6b", "qwen3-8b"] if gpu and not a.quick else ["tiny"]


def _models(a: argparse.Namespace, shape: str | None, work: Path) -> tuple[Path, Path, str]:
    """Model folders A and B for one suite, and how the report names the model."""
    if shape is None:
        model_a = a.model.resolve()
        model_b = a.model_b.resolve() if a.model_b else alias_model(model_a, work / "model-b")
        return model_a, model_b, str(model_a)
    cache = a.models_dir or (work / "models" if shape == "tiny" else MODEL_CACHE)
    print(f"building {shape} random-weight model in {cache} ...", flush=True)
    model_a = build_model(shape, cache / shape)
    # tiny: a real second model (cheap); large shapes: the same files under another name.
    model_b = (
        build_model(shape, cache / f"{shape}-b", seed=1)
        if shape == "tiny"
        else alias_model(model_a, work / "model-b")
    )
    return model_a, model_b, f"random-weight {shape}"


async def run_suite(
    a, model_a: Path, model_b: Path, model_label: str, out: Path, work: Path, gpu: bool
) -> str:
    """Start every server, run the chosen workloads, write and return the markdown."""
    sizes = context.QUICK if a.quick else context.FULL
    if a.repeats:
        sizes = context.Sizes(**{**sizes.__dict__, "repeats": a.repeats})
    if a.levels:
        sizes = context.Sizes(**{**sizes.__dict__, "levels": a.levels})
    if a.long_prompts:
        sizes = context.Sizes(**{**sizes.__dict__, "long_prompts": a.long_prompts})
    if a.exclusive:
        sizes = context.Sizes(**{**sizes.__dict__, "exclusive": True})
    session = Session(model_a, model_b, work, out / "logs", swap_runs=sizes.repeats)
    figures: list[context.Figure] = []
    notes: list[str] = []
    try:
        await session.start()
        notes += session.notes
        ctx = context.Context(
            sizes=sizes,
            model_a=model_a,
            model_b=model_b,
            logit_bias=no_eos_bias(model_a),
            tokenizer=load_text_tokenizer(model_a),
            mlxd=session.mlxd,
            mlx_lm=session.mlx_lm,
            worker=session.worker,
            mlxd_swap=session.mlxd_swap,
            swap_how=session.swap_how,
            unload_mlxd=session.unload_mlxd if session.worker is not None else None,
            stop_mlx_lm=session.stop_mlx_lm,
            ensure_mlx_lm=session.ensure_mlx_lm,
        )
        if ctx.worker is None and "proxy" in a.only:
            notes.append("proxy: not measured, the supervisor is not running.")
        for name in a.only:
            print(f"[{dt.datetime.now():%H:%M:%S}] workload {name} ...", flush=True)
            try:
                figures += await getattr(workloads, name)(ctx)
            except Exception as exc:  # one broken workload must not lose the others' results
                notes.append(f"{name}: failed: {type(exc).__name__}: {exc}")
                print(f"  {name} failed: {exc}", file=sys.stderr, flush=True)
            # Written after every workload: a run cut short keeps what it measured.
            report.write(out, figures, _meta(a, sizes, session, gpu, model_label, notes))
    finally:
        session.stop()
    md, _ = report.write(out, figures, _meta(a, sizes, session, gpu, model_label, notes))
    return md


def _exit_on_sigterm(signum, frame) -> None:
    # SystemExit unwinds through the `finally` blocks that stop the servers.
    raise SystemExit(128 + signum)


def _meta(a, sizes, session, gpu: bool, model_label: str, notes: list[str]) -> dict:
    """What the report says about this run besides the figures."""
    return {
        **environment(gpu),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "model": model_label,
        "mlxd_target": session.mlxd_how,
        "sizes": sizes.__dict__,
        "sizes_text": (
            f"{'quick' if a.quick else 'full'}, {sizes.repeats} runs "
            f"(single {max(sizes.repeats, sizes.single_runs)}, "
            f"proxy {max(sizes.repeats, 9)} pairs), "
            f"single {sizes.single_prompt}+{sizes.single_tokens} tok, "
            f"long prompts {'/'.join(map(str, sizes.long_prompts))} tok "
            f"(×{sizes.long_clients} at once), levels {'/'.join(map(str, sizes.levels))}, "
            f"concurrency {sizes.conc_prompt}+{sizes.conc_tokens} tok × "
            f"{sizes.conc_requests}/client, {sizes.turns} turns"
        ),
        "servers": session.server_settings,
        "servers_text": session.servers_text,
        "notes": notes,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in STANDALONE:  # one module each, with its own options
        return importlib.import_module(f".{argv[0]}", __package__ or "bench").main(argv[1:])
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    gpu = _accelerated()
    out = a.out or ROOT / "bench" / "results" / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    # A short path under /tmp: UNIX socket paths are limited to ~100 bytes.
    work = Path(tempfile.mkdtemp(prefix="mlxd-bench-"))
    suites = [None] if a.model else _shapes(a, gpu)
    tables = []
    try:
        for shape in suites:
            model_a, model_b, label = _models(a, shape, work / (shape or "model"))
            suite_out = out / shape if len(suites) > 1 else out
            md = asyncio.run(
                run_suite(a, model_a, model_b, label, suite_out, work / (shape or "model"), gpu)
            )
            tables.append(md)
            print("\n" + md, flush=True)
    except (StartError, BenchError) as exc:  # a server that cannot serve: say which, briefly
        print(f"benchmark aborted: {exc}\nserver logs: {out}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if len(tables) > 1:
        (out / "results.md").write_text("\n".join(tables))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
