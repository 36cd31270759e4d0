"""`python -m bench masks`: a long prompt's prefill by attention path, one process, no HTTP.

    python -m bench masks --shape qwen3-8b            # 16k tokens (the H200 figures)
    python -m bench masks --shape tiny --tokens 1024  # a smoke run on the CPU

Two workloads, each timed per forward (ms) with MLX's peak memory:
- lone: one row of `--tokens` in 4,096-token chunks, through a plain cache ("causal"), through
  mlx-lm's BatchKVCache as it comes (an array mask: cuDNN with a bias on CUDA), and through it
  with mlxd's mask and routing (worker/attention.py);
- join: a row a quarter into its prompt, joined by three rows a sixteenth into theirs (left
  padding, as a newcomer joins a running prefill), then all four in chunks of a sixteenth up to
  `--tokens`: row by row through the causal kernel (mlxd), the blocked plain product, MLX's own.
Each runs twice: the first pays cuDNN's graph builds for its shapes; the second, with prompts
256 tokens shorter, shares all but its last forward's shapes with the first (the warm cost).
The join's last logits are compared with MLX's (max absolute difference).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench masks", description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="tiny", help="random-weight shape (default: tiny)")
    p.add_argument("--tokens", type=int, default=16384, help="prompt length")
    p.add_argument("--only", choices=["lone", "join"], help="one workload (default: both)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

    from mlxd.worker.model import attention
    from mlxd.worker.model.load import device_memory_bytes

    from .models import cached_model

    model = load(str(cached_model(a.shape)))[0]
    layers = model.layers
    mlx_mask, mlx_sdpa = BatchKVCache.make_mask, attention._fused

    def mlxd(on: bool) -> None:  # mlxd's mask and routing, or MLX's own
        if on:
            attention.causal_when_unpadded()
            attention.route_on_cuda(device_memory_bytes(), force=True)
        else:
            BatchKVCache.make_mask = mlx_mask  # type: ignore[method-assign]
            mx.fast.scaled_dot_product_attention = mlx_sdpa

    def timed_forwards(cache, x, start: int, chunk: int) -> tuple[list[float], float, Any]:
        mx.synchronize()
        mx.reset_peak_memory()
        per, out = [], None
        for i in range(start, x.shape[1], chunk):
            t = time.perf_counter()
            out = model(x[:, i : i + chunk], cache=cache)[:, -1]
            mx.eval(out, [c.state for c in cache])
            per.append((time.perf_counter() - t) * 1e3)
        return per, mx.get_peak_memory() / 2**30, out

    def lone(kind: str, n: int):
        cache = make_prompt_cache(model) if kind == "plain" else [BatchKVCache([0]) for _ in layers]
        x = mx.random.randint(0, 1000, (1, n))
        return timed_forwards(cache, x, 0, 4096)

    def join(n: int):
        first, chunk = a.tokens // 4, a.tokens // 16
        x = mx.random.randint(0, 1000, (4, n))
        cache = [BatchKVCache([0]) for _ in layers]
        mx.eval(model(x[:1, :first], cache=cache)[:, -1], [c.state for c in cache])
        fresh = [BatchKVCache([0, 0, 0]) for _ in layers]
        mx.eval(model(x[1:, :chunk], cache=fresh)[:, -1], [c.state for c in fresh])
        for c, f in zip(cache, fresh):
            c.extend(f)  # the newcomers are left-padded to the running row's history
        return timed_forwards(cache, x, first, chunk)

    def line(name: str, shift: int, run) -> Any:
        per, peak, out = run
        steps = "/".join(f"{p:.0f}" for p in per)
        print(f"| {name} | {shift} | {sum(per):.0f} | {steps} | {peak:.1f} |", flush=True)
        return out

    lone("plain", 512)  # load the kernels every case shares
    print(f"shape {a.shape}, device {mx.default_device()}, prompt {a.tokens} tokens\n")
    print("| case | shorter by | total ms | per forward ms | peak GiB |\n|---|---|---|---|---|")
    for shift in (0, 256) if a.only != "join" else ():
        n = a.tokens - shift
        mlxd(False)
        line("lone: plain cache (causal)", shift, lone("plain", n))
        line("lone: BatchKVCache, MLX (array mask)", shift, lone("batch", n))
        mlxd(True)
        line("lone: BatchKVCache, mlxd (causal)", shift, lone("batch", n))
    diffs = []
    for shift in (0, 256) if a.only != "lone" else ():
        n, outs = a.tokens - shift, {}
        for name in ("row by row", "blocked", "MLX"):
            mlxd(name != "MLX")
            left_of = attention._left_padding_of
            if name == "blocked":  # the padding unknown: the array-mask path
                attention._left_padding_of = lambda _m: None
            mx.random.seed(shift)
            try:
                outs[name] = line(f"join: {name}", shift, join(n))
            finally:
                attention._left_padding_of = left_of
        ref = outs["MLX"].astype(mx.float32)
        for name in ("row by row", "blocked"):
            d = mx.abs(outs[name].astype(mx.float32) - ref).max().item()
            diffs.append(f"{name} {d:.4f} (shorter by {shift})")
    mlxd(False)
    if diffs:
        print("\njoin's last logits, max |difference| from MLX's: " + ", ".join(diffs))
    sys.stdout.flush()
    return 0
