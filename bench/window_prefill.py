"""`python -m bench.window_prefill`: where a cold long prompt's time goes on a sliding-window
model, in process (no HTTP).

    python -m bench.window_prefill --shape gemma3-12b --tokens 16404   # the GPU question
    python -m bench.window_prefill --shape tiny-gemma3 --tokens 1500   # a CPU smoke (~1 min)

Why: on an H100 (2026-12-07) both servers prefilled gemma3-12b's 16k-token prompt at 3-4k
tok/s where the 8B shape runs at 24k. A window layer's chunk attends over the chunk plus the
window's keys (mlx-lm's rotating cache concatenates them), so its attention grows with the
chunk, and its mask is an array (no fused causal kernel). This measures, for one cold prompt
of `--tokens` fresh ids:
- mlx-lm's own forward on its plain caches in 2,048-token chunks (what `generate` does);
- mlxd's engine with prefill chunks of 4,096 (the GPU default), 2,048 and 1,024 tokens,
  first token from the prefill forward (the GPU default) and, at 4,096, without;
- then one request per chunk size again with every attention call timed apart (synchronized
  before and after, so the wall grows: read the shares), by mask kind and shape.
Each figure: the seconds of every repeat, the best as tok/s, MLX's peak memory.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.window_prefill", description=__doc__)
    p.add_argument("--shape", default="tiny-gemma3", help="random-weight shape")
    p.add_argument("--tokens", type=int, default=1500, help="the cold prompt's length")
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from mlxd.worker.device_env import apply_device_env

    apply_device_env(os.environ)
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from mlxd.shared.params import GenerationParams
    from mlxd.worker.engine.loop import Engine
    from mlxd.worker.engine.rows import Submission
    from mlxd.worker.engine.sched.planner import PlanConfig
    from mlxd.worker.model import shape_buckets
    from mlxd.worker.model.load import load_model

    from .models import cached_model

    loaded = load_model(cached_model(a.shape), "window-prefill")
    model, vocab, n = loaded.model, loaded.model.args.vocab_size, a.tokens
    seed = [0]
    engines: list = []

    def fresh() -> list[int]:  # ids nobody sent before: no cache hit
        seed[0] += 1
        return [(1000 + seed[0] * 7919 + i * 13) % (vocab - 10) + 5 for i in range(n)]

    def report(name: str, run) -> None:
        ts = []
        for _ in range(a.repeats):
            mx.clear_cache()
            mx.reset_peak_memory()
            t = time.perf_counter()
            run(fresh())
            ts.append(time.perf_counter() - t)
        each = " ".join(f"{t:.2f}" for t in ts)
        peak = mx.get_peak_memory() / 2**30
        print(f"| {name} | {each} | {n / min(ts):,.0f} | {peak:.1f} |", flush=True)

    def plain(ids: list[int]) -> None:
        cache = make_prompt_cache(model)
        x = mx.array(ids)[None]
        for i in range(0, len(ids), 2048):
            y = model(x[:, i : i + 2048], cache=cache)
            mx.eval(y[:, -1:], [c.state for c in cache])

    def engine(chunk: int, fold: bool):
        shape_buckets.set_on(True)  # the worker's CUDA default
        e = Engine(
            loaded, batch=16, plan=PlanConfig(idle_chunk=chunk), first_token_from_prefill=fold
        )
        e.start()
        e.warmed.wait()
        engines.append(e)
        params = GenerationParams(max_tokens=1, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0)

        def run(ids: list[int]) -> None:
            done = threading.Event()

            def sink(ev) -> None:
                if ev.finish_reason is not None:
                    done.set()

            seed[0] += 1
            e.submit(Submission(f"r{seed[0]}", ids, params, sink))
            assert done.wait(600)

        return run

    print(f"{a.shape} · {mx.default_device()} · mlx {mx.__version__} · cold prompt of {n}\n")
    print("| way | seconds per repeat | best tok/s | peak GiB |\n|---|---|---:|---:|")
    report("mlx-lm forward, plain caches, 2,048-token chunks", plain)
    runs = {}
    for chunk, fold in ((4096, True), (4096, False), (2048, True), (1024, True)):
        runs[(chunk, fold)] = engine(chunk, fold)
        how = "from the prefill forward" if fold else "from a decode forward"
        report(f"mlxd engine, {chunk:,}-token chunks, first token {how}", runs[(chunk, fold)])

    fused = mx.fast.scaled_dot_product_attention  # as the worker routes it (attention.py)
    spent: dict[tuple, float] = defaultdict(float)
    calls: Counter[tuple] = Counter()

    def timed(q, k, v, *args, **kw):
        mask = kw.get("mask")
        kind = "none" if mask is None else mask if isinstance(mask, str) else "array"
        mx.eval(q, k, v)
        mx.synchronize()
        t = time.perf_counter()
        out = fused(q, k, v, *args, **kw)
        mx.eval(out)
        mx.synchronize()
        key = (kind, q.shape[0], q.shape[2], k.shape[2])
        spent[key] += time.perf_counter() - t
        calls[key] += 1
        return out

    for chunk in (4096, 1024):
        spent.clear()
        calls.clear()
        mx.fast.scaled_dot_product_attention = timed
        t0 = time.perf_counter()
        runs[(chunk, True)](fresh())
        wall = time.perf_counter() - t0
        mx.fast.scaled_dot_product_attention = fused
        print(
            f"\n{chunk:,}-token chunks, attention timed apart: wall {wall:.2f} s,"
            f" attention {sum(spent.values()):.2f} s\n"
        )
        print("| mask | rows | queries | keys | calls | ms |\n|---|---:|---:|---:|---:|---:|")
        for key, s in sorted(spent.items(), key=lambda kv: -kv[1])[:12]:
            print(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {calls[key]} | {s * 1e3:.1f} |")
    for e in engines:
        e.stop()
        e.join(30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
