"""`python -m bench profile`: where a decode step's time goes, in one process, no HTTP.

    python -m bench profile                          # tiny random model (CPU: a minute)
    python -m bench profile --shape qwen3-8b --batches 1,8,32
    python -m bench profile --model ~/models/Qwen3-8B-4bit

For each batch size it decodes the same greedy rows (end-of-sequence banned by logit_bias, as
in `bench run`) three ways and prints tokens per second for each:

- `stream_generate`: mlx-lm's single-stream loop (batch 1 only): the floor to beat;
- `BatchGenerator`: mlx-lm's batch loop alone, what mlx_lm.server decodes with;
- `mlxd engine`: our engine thread with counting sinks (and `mlxd engine, compiled forward`:
  the same with `compile_decode` on, engine/compiled.py), the step split into
  build (Python building the model's and the sampler's graph), wait (the device time the
  pipeline does not hide), rows (per-row bookkeeping in the decode batch), generator (mlx-lm's
  BatchGenerator around it), emit (detokenizing, stop strings, events).

The difference between `mlxd engine` and `bench run`'s single stream is the hand-off to the
event loop, the HTTP writing and the proxy hop.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("build", "wait", "rows", "generator", "emit")
PLAIN = "the profile's plain-forward row"  # CompiledStep.off while that row runs


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench profile", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="mlx-lm model folder (default: --shape's)")
    p.add_argument("--shape", default=None, help="random-weight shape (default: tiny)")
    ints = lambda v: tuple(int(x) for x in v.split(",") if x.strip())  # noqa: E731
    p.add_argument("--batches", type=ints, default=(1, 8), help="batch sizes, e.g. 1,8,32")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens per row")
    p.add_argument("--tokens", type=int, default=256, help="tokens generated per row")
    p.add_argument("--repeats", type=int, default=3, help="runs per figure (median shown)")
    return p.parse_args(argv)


def _model(a: argparse.Namespace) -> Path:
    if a.model:
        return a.model.resolve()
    from .models import cached_model

    return cached_model(a.shape or "tiny")


def _prompts(tok, n_rows: int, n_tokens: int) -> list[list[int]]:
    base = tok.encode("The quick brown fox jumps over the lazy dog. " * (n_tokens // 8 + 2))
    return [[(i * 31 + 7) % 200 + 10] + base[: n_tokens - 1] for i in range(n_rows)]


def stream_generate_tps(model, tok, prompt, n: int, bias: dict) -> float:
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_logits_processors

    procs = make_logits_processors(logit_bias=bias)
    first = last = None
    count = 0
    for _ in stream_generate(model, tok, prompt, max_tokens=n, logits_processors=procs):
        last = time.perf_counter()
        first = first or last
        count += 1
    return (count - 1) / (last - first)


def batch_generator_tps(model, prompts, n: int, bias: dict) -> float:
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_logits_processors

    gen = BatchGenerator(model, completion_batch_size=max(32, len(prompts)))
    procs = [make_logits_processors(logit_bias=bias) for _ in prompts]
    gen.insert(prompts, max_tokens=[n] * len(prompts), logits_processors=procs)
    left, count, first = len(prompts), 0, None
    try:
        while left:
            _, responses = gen.next()
            if responses and first is None and len(responses) == len(prompts):
                first, count = time.perf_counter(), 0
            count += len(responses)
            left -= sum(1 for r in responses if r.finish_reason is not None)
        return (count - len(prompts)) / (time.perf_counter() - first)
    finally:
        gen.close()


def engine_run(engine, prompts, n: int, bias: dict) -> tuple[float, dict[str, float]]:
    """Tokens per second of the engine's decode, and ms per step of each phase."""
    from mlxd.shared.params import GenerationParams
    from mlxd.worker.engine.rows import Submission
    from mlxd.worker.engine.step.token import Clock

    params = GenerationParams(
        max_tokens=n, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, logit_bias=bias
    )
    clock: Clock = engine.clock
    done = threading.Semaphore(0)
    state = {"started": 0, "t0": 0.0, "tokens": 0}
    seen: set[int] = set()

    def sink_for(i: int):
        def sink(ev) -> None:
            if i not in seen:
                seen.add(i)
                if len(seen) == len(prompts):  # every row decodes: start the clock
                    clock.clear()
                    clock.steps = 0
                    state["t0"], state["tokens"] = time.perf_counter(), 0
            state["tokens"] += 1
            if ev.finish_reason is not None:
                done.release()

        return sink

    for i, p in enumerate(prompts):
        engine.submit(Submission(f"p{i}", list(p), params, sink_for(i)))
    for _ in prompts:
        done.acquire()
    took = time.perf_counter() - state["t0"]
    steps = max(1, clock.steps)
    phases = {k: 1000 * clock[k] / steps for k in ("build", "wait", "rows", "emit")}
    phases["generator"] = 1000 * (clock["step"] / steps) - sum(
        phases[k] for k in ("build", "wait", "rows")
    )
    return (state["tokens"] - len(prompts)) / took, phases


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from mlxd.worker.device_env import apply_device_env

    apply_device_env(os.environ)  # as the worker runs (before MLX's first kernel)
    import mlx.core as mx
    from mlx_lm import load

    from mlxd.worker.engine.loop import Engine
    from mlxd.worker.engine.step.compiled import for_model
    from mlxd.worker.engine.step.token import Clock
    from mlxd.worker.model.load import load_model

    from .models import no_eos_bias

    path = _model(a)
    bias = {int(k): v for k, v in no_eos_bias(path).items()}
    model, tok = load(str(path))
    loaded = load_model(path, "profile")
    engine = Engine(loaded, batch=max(32, *a.batches), compile_decode=True)
    engine.clock = Clock()
    engine.start()
    engine.warmed.wait()
    print(f"model {path} · device {mx.default_device()} · mlx {mx.__version__}")
    print(f"prompt {a.prompt} tokens, {a.tokens} generated per row, median of {a.repeats}\n")
    head = "| path | batch | tok/s | ms/step | " + " | ".join(PHASES) + " |"
    print(head + "\n|" + "---|" * (4 + len(PHASES)))
    for b in a.batches:
        prompts = _prompts(tok, b, a.prompt)
        if b == 1:
            tps = [
                stream_generate_tps(model, tok, prompts[0], a.tokens, bias)
                for _ in range(a.repeats)
            ]
            _row("stream_generate", b, statistics.median(tps))
        tps = [batch_generator_tps(model, prompts, a.tokens, bias) for _ in range(a.repeats)]
        _row("BatchGenerator", b, statistics.median(tps))
        step = for_model(loaded.model)
        for name, compiled in (("mlxd engine", False), ("mlxd engine, compiled forward", True)):
            if step.off in (None, PLAIN):  # a real reason to stay plain is kept
                step.off = None if compiled else PLAIN
            runs = [engine_run(engine, prompts, a.tokens, bias) for _ in range(a.repeats)]
            mid = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
            _row(name if step.off in (None, PLAIN) else f"{name} (plain: {step.off})", b, *mid)
    engine.stop()
    engine.join(30)
    return 0


def _row(name: str, batch: int, tps: float, phases: dict[str, float] | None = None) -> None:
    step_ms = 1000 * batch / tps if tps else 0.0
    split = [f"{phases[k]:.2f}" if phases else "" for k in PHASES]
    print(
        f"| {name} | {batch} | {tps:.1f} | {step_ms:.2f} | " + " | ".join(split) + " |", flush=True
    )
