"""`python -m bench attention`: what a prefill or decode call costs on first use of its shape.

    python -m bench attention --shape qwen3-0.6b            # MLX's attention, then mlxd's routing
    python -m bench attention --shape qwen3-8b --no-cudnn   # the same with cuDNN off (the process)

MLX's CUDA attention builds a cuDNN graph per new shape (worker/attention.py says why mlxd routes
around it). Each scenario calls the model's forward on random tokens, evaluated, and prints the
milliseconds of each call; "new" calls use prompt lengths not seen before in the process. The
two modes run in one process, MLX's own attention first: graphs it built stay cached, so every
"new" call draws fresh lengths. `--no-cudnn` sets MLX_CUDA_USE_CUDNN_SDPA=0 before MLX loads.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench attention", description=__doc__.split("\n")[0]
    )
    p.add_argument("--shape", default="tiny", help="random-weight shape (default: tiny)")
    p.add_argument("--no-cudnn", action="store_true", help="MLX_CUDA_USE_CUDNN_SDPA=0")
    p.add_argument("--long", type=int, default=16384, help="the long prompt, in tokens")
    p.add_argument("--steps", type=int, default=300, help="lone-row decode steps")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    if a.no_cudnn:
        os.environ["MLX_CUDA_USE_CUDNN_SDPA"] = "0"
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

    from mlxd.worker.model import attention
    from mlxd.worker.model.load import device_memory_bytes

    from .models import cached_model

    model, _ = load(str(cached_model(a.shape)))
    rng = random.Random(0)

    def timed(fn: Callable[[], None]) -> float:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    def tokens(rows: int, n: int):
        x = mx.random.randint(0, 1000, (rows, n))
        mx.eval(x)
        return x

    def batched(lengths: list[int]) -> float:
        """A right-padded prompt batch, as mlx-lm's prompt batch runs it (an array mask)."""
        cache = [BatchKVCache([0] * len(lengths)) for _ in model.layers]
        m = max(lengths)
        for c in cache:
            c.prepare(lengths=lengths, right_padding=[m - n for n in lengths])
        x = tokens(len(lengths), m)
        return timed(lambda: mx.eval(model(x, cache=cache), [c.state for c in cache]))

    def single(n: int, chunk: int = 4096, cache=None) -> float:
        cache = cache if cache is not None else make_prompt_cache(model)
        x = tokens(1, n)

        def run() -> None:
            for i in range(0, n, chunk):
                mx.eval(model(x[:, i : i + chunk], cache=cache), [c.state for c in cache])

        return timed(run)

    def lone_decode(context: int) -> str:
        cache = make_prompt_cache(model)
        single(context, cache=cache)
        tok = mx.zeros((1, 1), dtype=mx.int32)
        ms = [timed(lambda: mx.eval(model(tok, cache=cache))) for _ in range(a.steps)]
        return f"{statistics.median(ms):.2f} / {max(ms):.0f}"

    def row(*calls: float) -> str:
        return ", ".join(f"{c:.0f}" for c in calls)

    def scenarios() -> dict[str, str]:
        new8 = [[rng.randint(500, 530) for _ in range(8)] for _ in range(6)]
        long = a.long
        return {
            "8 rows ~515 tokens, right-padded, 6 calls of new lengths": row(
                *(batched(ls) for ls in new8)
            ),
            "8 rows x 512, same shape 3 times": row(*(batched([512] * 8) for _ in range(3))),
            "one row ~2,050 tokens (plain cache, causal), new lengths": row(
                *(single(rng.randint(2000, 2100)) for _ in range(4))
            ),
            f"one row ~{long} tokens in 4,096-token chunks, 2 new lengths then 2 same": row(
                *(single(long - rng.randint(1, 300)) for _ in range(2)),
                *(single(long) for _ in range(2)),
            ),
            f"lone-row decode from 2,100 tokens, {a.steps} steps: median / max ms": lone_decode(
                2100
            ),
        }

    single(64)  # load the kernels every scenario shares
    gpu = mx.default_device() == mx.gpu
    cudnn = ("cuDNN off" if a.no_cudnn else "cuDNN on") if gpu else "no GPU: nothing to route"
    results = {"MLX's attention": scenarios()}
    attention.route_on_cuda(device_memory_bytes(), force=True)
    results["mlxd's routing (worker/attention.py)"] = scenarios()
    mx.fast.scaled_dot_product_attention = attention._fused
    print(f"shape {a.shape}, device {mx.default_device()}, {cudnn}; ms per call\n")
    print("| call | " + " | ".join(results) + " |")
    print("|---|" + "---|" * len(results))
    for name in results["MLX's attention"]:
        print(f"| {name} | " + " | ".join(r[name] for r in results.values()) + " |")
    sys.stdout.flush()
    return 0
