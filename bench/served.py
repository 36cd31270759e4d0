"""The harness of a standalone side-by-side bench command (`agents`, `claude`): the common
options, the model (a random-weight shape or a folder), both servers started as `bench run`
starts them, and the report written after every workload so a run cut short keeps its rows."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from . import context, report
from .client import BenchError
from .models import MODEL_CACHE, SHAPE_NAMES, build_model, load_text_tokenizer, no_eos_bias
from .servers import StartError
from .session import Session, environment

# A workload: the run's Context -> its Figures (and notes, appended to the list it is given).
Workload = Callable[[context.Context, list[str]], Awaitable[list[context.Figure]]]
# Before the servers start: (model folder, work folder) -> the supervisor's config.toml text.
Prepare = Callable[[Path, Path], str]


def common_args(p: argparse.ArgumentParser) -> None:
    """The options every standalone side-by-side command takes."""
    p.add_argument("--model", type=Path, help="mlx-lm model folder (default: --shape's)")
    p.add_argument("--shape", default="tiny", help=f"one of {', '.join(SHAPE_NAMES)}")
    p.add_argument("--repeats", type=int, default=3, help="runs per figure (median)")
    p.add_argument("--out", type=Path, help="results folder (results.md, results.json, logs/)")
    p.add_argument(
        "--exclusive",
        action="store_true",
        help="one server on the device at a time: mlxd's model unloaded for mlx_lm.server's turns, "
        "mlx_lm.server stopped for mlxd's",
    )


def parser(command: str, doc: str, repeats: int | None = None) -> argparse.ArgumentParser:
    """`python -m bench <command>`'s parser with the common options (`repeats`: its default)."""
    p = argparse.ArgumentParser(prog=f"python -m bench {command}", description=doc.splitlines()[0])
    common_args(p)
    if repeats is not None:
        p.set_defaults(repeats=repeats)
    return p


def ints(v: str) -> tuple[int, ...]:
    """`1,4,8` -> (1, 4, 8)."""
    return tuple(int(x) for x in v.split(",") if x.strip())


def model_folder(a: argparse.Namespace, work: Path) -> tuple[Path, str]:
    """The model to serve and how the report names it."""
    if a.model:
        return a.model.resolve(), str(a.model)
    if a.shape not in SHAPE_NAMES:
        sys.exit(f"unknown shape {a.shape}; choose from {', '.join(SHAPE_NAMES)}")
    cache = work / "models" if a.shape.startswith("tiny") else MODEL_CACHE  # tiny: cheap
    print(f"building {a.shape} random-weight model in {cache} ...", flush=True)
    return build_model(a.shape, cache / a.shape), f"random-weight {a.shape}"


def accelerated() -> bool:
    """Whether MLX's default device here is a GPU (asked in a child: no MLX in this process)."""
    code = "import mlx.core as mx; print(mx.default_device().type == mx.DeviceType.gpu)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return r.stdout.strip() == "True"


async def _run(
    a,
    gpu: bool,
    model: Path,
    label: str,
    work: Path,
    out: Path,
    parts: list[tuple[str, Workload]],
    sizes,
    config: str = "",
) -> str:
    session = Session(model, model, work, out / "logs", swap_runs=0, config=config)
    figures: list[context.Figure] = []
    notes: list[str] = []

    def meta() -> dict:
        return {
            **environment(gpu),
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "model": label,
            "mlxd_target": session.mlxd_how,
            "servers_text": session.servers_text,
            "sizes_text": sizes,
            "notes": session.notes + notes,
        }

    try:
        await session.start()
        ctx = context.Context(
            sizes=replace(context.FULL, exclusive=getattr(a, "exclusive", False)),
            model_a=model,
            model_b=model,
            logit_bias=no_eos_bias(model),
            tokenizer=load_text_tokenizer(model),
            mlxd=session.mlxd,
            mlx_lm=session.mlx_lm,
            worker=session.worker,
            unload_mlxd=session.unload_mlxd if session.worker is not None else None,
            stop_mlx_lm=session.stop_mlx_lm,
            ensure_mlx_lm=session.ensure_mlx_lm,
        )
        for name, workload in parts:
            print(f"[{dt.datetime.now():%H:%M:%S}] {name} ...", flush=True)
            try:
                figures += await workload(ctx, notes)
            except Exception as exc:  # one broken workload must not lose the others' rows
                notes.append(f"{name}: failed: {type(exc).__name__}: {exc}")
                print(f"  {name} failed: {exc}", file=sys.stderr, flush=True)
            report.write(out, figures, meta())
    finally:
        session.stop()
    md, _ = report.write(out, figures, meta())
    return md


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through the `finally` that stops the servers


def main(
    a: argparse.Namespace,
    parts: list[tuple[str, Workload]],
    sizes: str,
    prepare: Prepare | None = None,
) -> int:
    """Build or take the model, start both servers, run `parts` in order, print the table.
    `prepare` makes what the model needs besides (adapters) and says mlxd's config.toml."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    out = a.out or Path(__file__).resolve().parent / "results" / dt.datetime.now().strftime(
        "%Y%m%d-%H%M%S"
    )
    work = Path(tempfile.mkdtemp(prefix="mlxd-bench-"))  # short: UNIX socket paths
    try:
        model, label = model_folder(a, work)
        config = prepare(model, work) if prepare is not None else ""
        md = asyncio.run(_run(a, accelerated(), model, label, work, out, parts, sizes, config))
    except (StartError, BenchError) as exc:
        print(f"benchmark aborted: {exc}\nserver logs: {out}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n" + md + f"\nresults: {out}", flush=True)
    return 0
