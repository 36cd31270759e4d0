"""`python -m bench cpu_blas`: mlx-lm's own batch decode on MLX's CPU backend, with the BLAS
that MLX's Linux wheel bundles (the reference one) and with OpenBLAS loaded the way a CPU
worker loads it (src/mlxd/worker/cpu_blas.py), each run in a fresh process, alternating.

    python -m bench cpu_blas                                  # the tiny model, rows 1,4,8
    python -m bench cpu_blas --shape qwen3-0.6b --rows 1,8 --tokens 32 --repeats 2

mlx_lm.server on Linux multiplies with the bundled BLAS: the `bundled` column is what it gets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from .models import ROOT, SHAPE_NAMES, cached_model


def child(model: str, rows: list[int], tokens: int) -> dict[int, float]:
    """Decode tok/s of `rows` rows at once (after each row's first token), in this process."""
    sys.path.insert(0, str(ROOT / "src"))
    from mlxd.worker.cpu_blas import load_cpu_blas

    load_cpu_blas(os.environ)  # MLXD_CPU_BLAS, as the parent set it
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.generate import BatchGenerator

    mx.set_default_device(mx.cpu)  # on a GPU machine too: this measures the CPU backend
    model_, tok = mlx_lm.load(model)
    out = {}
    for k in rows:
        gen = BatchGenerator(model_, stop_tokens=set())
        gen.insert([tok.encode(f"Row {i}: count to ten.") for i in range(k)], [tokens] * k)
        got, t0, at_t0 = 0, 0.0, 0
        while got < tokens * k:
            r = gen.next()
            got += len((r[-1] if isinstance(r, tuple) else r) or [])
            if got and not t0:  # the first tokens end the prefill: time the decode from here
                t0, at_t0 = time.perf_counter(), got
        out[k] = (got - at_t0) / (time.perf_counter() - t0)
        gen.close()
    return out


def run_child(model: str, rows: list[int], tokens: int, blas: str) -> dict[int, float]:
    cmd = [sys.executable, "-m", "bench.cpu_blas", "--child", model, "--rows",
           ",".join(map(str, rows)), "--tokens", str(tokens)]  # fmt: skip
    env = {**os.environ, "MLXD_CPU_BLAS": blas}
    line = subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    return {int(k): v for k, v in json.loads(line.stdout.strip().splitlines()[-1]).items()}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench cpu_blas", description=__doc__)
    p.add_argument("--shape", default="tiny", choices=SHAPE_NAMES)
    p.add_argument("--rows", default="1,4,8")
    p.add_argument("--tokens", type=int, default=200, help="tokens per row")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    rows = [int(x) for x in a.rows.split(",")]
    if a.child:
        print(json.dumps(child(a.child, rows, a.tokens)))
        return 0
    model = str(cached_model(a.shape))
    runs: dict[str, list[dict[int, float]]] = {"off": [], "auto": []}
    for _ in range(a.repeats):
        for blas in runs:
            runs[blas].append(run_child(model, rows, a.tokens, blas))
    print(f"{a.shape}: decode tok/s after each row's first token, {a.tokens} tokens a row, "
          f"median of {a.repeats} (min-max); bundled = MLXD_CPU_BLAS=off")  # fmt: skip
    print(f"{'rows':>4}  {'bundled BLAS':>22}  {'OpenBLAS (auto)':>22}  ratio")
    for k in rows:
        cols = []
        for blas in runs:
            v = [r[k] for r in runs[blas]]
            cols.append((statistics.median(v), min(v), max(v)))
        (b, bl, bh), (o, ol, oh) = cols
        print(
            f"{k:>4}  {b:8.1f} ({bl:6.1f}-{bh:6.1f})  {o:8.1f} ({ol:6.1f}-{oh:6.1f})  {o / b:5.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
