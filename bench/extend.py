"""`python -m bench extend`: rows that extend a cached prefix, prefilled by the engine in
process (no HTTP), against what the same tokens cost as plain prefills.

    python -m bench extend --shape qwen3-8b                    # the H200 figures
    python -m bench extend --shape tiny --prefix 512 --new 64  # a smoke run on the CPU
    python -m bench extend --shape qwen3-8b --buckets          # attention in bucketed shapes

What agents send: K sessions share a long prefix (system prompt and tools) the prompt cache
already holds, each at its own history length, and each turn adds a few hundred tokens. For
K = 1, 2, 4, 8 rows submitted at once (each row's history cached first, as its previous turn
would have left it), the engine's time until every row has its first token, and the prefill
rate that makes (new tokens / that time). Against it, in the same process:
- `cold`: one lone prompt of the prefix length, uncached (the engine's plain prefill rate);
- `plain`: the same K extensions through mlx-lm's plain KVCache, one row after another on a
  copy of its cached history (what an unpadded, unbatched prefill costs: the floor to reach).
The engine's step log goes to `--step-log` (bench/steps.py reads it): where the time went.
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


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench extend", description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="tiny", help="random-weight shape (default: tiny)")
    p.add_argument("--prefix", type=int, default=6000, help="shared prefix, tokens")
    p.add_argument("--history", type=int, default=300, help="row i's own history: i x this")
    p.add_argument("--new", type=int, default=200, help="tokens each row adds")
    p.add_argument("--rows", default="1,2,4,8", help="K values")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--step-log", type=Path, help="the engine's step log (JSON lines)")
    p.add_argument("--phases", action="store_true", help="where each K's time went")
    p.add_argument("--variant", default="default", help="attention routing to try (extend_phases)")
    p.add_argument(
        "--block",
        type=int,
        default=-1,
        help="prefill block, tokens (worker/model/blocks.py; -1: the worker's default, off)",
    )
    p.add_argument(
        "--mlx-lm-first-token",
        action="store_true",
        help="first tokens from a decode forward of the last prompt token, as mlx-lm samples "
        "them (default: from the prefill forward, worker/model/head.py)",
    )
    p.add_argument(
        "--buckets",
        action="store_true",
        help="pad extending rows' attention to bucketed shapes (worker/model/shape_buckets.py)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=8,
        help="tokens each row asks for (a first token that is also the last waits for the row's "
        "end: its KV stored to the prompt cache; 1 measured that until 2026-12-07)",
    )
    p.add_argument(
        "--late-first-token",
        action="store_true",
        help="a row's first token sent after the next decode step, as mlx-lm returns it "
        "(default: at the end of the step that drew it, emit.send_first)",
    )
    p.add_argument(
        "--worker-buffers",
        action="store_true",
        help="MLX's buffer cache capped as a worker caps it (model/load.py limit_buffer_cache: "
        "1/16 of the device; default: MLX's own, the whole device)",
    )
    p.add_argument(
        "--ssd",
        action="store_true",
        help="an SSD tier beside the RAM tier, each row's history written behind (as a "
        "worker's write-behind does between turns) before its extension",
    )
    p.add_argument(
        "--ssd-in-place",
        action="store_true",
        help="with --ssd: the writer reads the entries' own arrays, as before 2026-12-07 (on "
        "CUDA it reads device-made copies, kv_arrays.device_copies)",
    )
    p.add_argument(
        "--keep-buffers",
        action="store_true",
        help="no mx.clear_cache() anywhere in the process (the prefill gives MLX's buffers back "
        "after every forward, as mlx-lm does; on CUDA each next forward allocates them again)",
    )
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from mlxd.worker.device_env import apply_device_env

    apply_device_env(os.environ)
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    if a.keep_buffers:
        mx.clear_cache = lambda: None  # every module looks it up on mx at each call

    from mlxd.shared.params import GenerationParams
    from mlxd.worker.cache.prompt_cache import PromptCache
    from mlxd.worker.engine import loop
    from mlxd.worker.engine.loop import Engine
    from mlxd.worker.engine.rows import Submission
    from mlxd.worker.engine.sched.planner import PlanConfig
    from mlxd.worker.engine.steplog import open_step_log
    from mlxd.worker.model import blocks, shape_buckets
    from mlxd.worker.model.load import choose_block, load_model, use_blocks

    from .models import cached_model

    if a.worker_buffers:
        from mlxd.worker.model.load import limit_buffer_cache

        limit_buffer_cache()
    path = cached_model(a.shape)
    loaded = load_model(path, "extend")
    blocks.ANY_DEVICE = True  # measured on any device, the CPU included (off there in a worker)
    use_blocks(choose_block(loaded.model, None if a.block < 0 else a.block))
    shape_buckets.set_on(a.buckets)
    vocab = loaded.model.args.vocab_size if hasattr(loaded.model, "args") else 32000
    trace = open_step_log(a.step_log, "extend") if a.step_log else None
    # The RAM tier holds every row's history at K = 8 on the 8B (~10 GB); 64 GiB left an H100
    # (80 GB) no room for the plain baseline's caches beside the model.
    ssd_dir = None
    if a.ssd:
        import tempfile

        from mlxd.worker.cache import kv_arrays

        kv_arrays.DEVICE_COPIES = False if a.ssd_in_place else None
        ssd_dir = Path(tempfile.mkdtemp(prefix="extend-ssd-"))
        layout = kv_arrays.kv_layout(loaded.model)
        # earn_tokens 0: every history is written (a session's turns earn it by their reuse)
        cache = PromptCache(16 << 30, ssd_dir, 12 << 30, layout=layout, quiet_s=0, earn_tokens=0)
        cache.start()
    else:  # the RAM tier alone, as every run before 2026-12-07 12:40 measured
        cache = PromptCache(16 << 30, None, 0)
    phases = None
    if a.phases or a.variant != "default":
        from .extend_phases import Phases

        phases = Phases(mx)
        phases.install(a.variant)
        phases.wrap_model(loaded.model)
    if a.late_first_token:
        loop.first_tokens = lambda gen: []  # type: ignore[assignment]
    plan = PlanConfig(block=blocks.block)
    fold = not a.mlx_lm_first_token
    engine = Engine(
        loaded, batch=16, plan=plan, cache=cache, trace=trace, first_token_from_prefill=fold
    )
    engine.start()
    engine.warmed.wait()
    params = GenerationParams(
        max_tokens=a.max_tokens, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0
    )
    seed = [0]

    def fresh(n: int) -> list[int]:  # ids nobody sent before: no cache hit
        seed[0] += 1
        base = 1000 + (seed[0] * 7919) % (vocab - 2000)
        return [(base + i * 13) % (vocab - 10) + 5 for i in range(n)]

    def run(prompts: list[list[int]]) -> list[float]:
        """Submit at once; seconds until each row's first token (same order)."""
        firsts = [0.0] * len(prompts)
        done = threading.Semaphore(0)
        t0 = time.perf_counter()
        for i, p in enumerate(prompts):

            def sink(ev, i=i) -> None:
                if (ev.completion_tokens or ev.finish_reason) and not firsts[i]:
                    firsts[i] = time.perf_counter() - t0
                if ev.finish_reason is not None:
                    done.release()

            engine.submit(Submission(f"x{seed[0]}-{i}", p, params, sink))
        for _ in prompts:
            assert done.acquire(timeout=600)
        return firsts

    print(
        f"model {path} · device {mx.default_device()} · mlx {mx.__version__} · variant {a.variant}"
        f" · prefill block {blocks.block} · shape buckets {'on' if shape_buckets.on else 'off'}"
        f" · first token from {'the prefill forward' if fold else 'a decode forward'}"
        f"{' (sent after the next decode step)' if a.late_first_token else ''}"
        f"{' · buffers kept (no clear_cache)' if a.keep_buffers else ''}"
        f"{' · buffer cache capped as in a worker' if a.worker_buffers else ''}"
        f"{' · SSD tier, histories written behind' if a.ssd else ''}"
        f"{' from the entries in place' if a.ssd_in_place else ''}"
        f" · {a.max_tokens} tokens a row"
        f"{'' if engine._batch.head is not None or not fold else ' (no head found: decode)'}"
    )
    print(
        f"prefix {a.prefix}, row i's history i x {a.history} (+7r+1 in repeat r), +{a.new} new "
        "tokens a row; "
        f"median of {a.repeats} (min-max)\n"
    )
    cold = [a.prefix / run([fresh(a.prefix)])[0] for _ in range(a.repeats)]
    print(f"cold lone prompt of {a.prefix}: {_spread(cold)} tok/s\n", flush=True)
    print(
        "| K | engine: all first tokens s | engine tok/s | plain rows s | plain tok/s | "
        "engine / plain | engine / cold |"
    )
    print("|---|---|---|---|---|---|---|")
    for k in [int(x) for x in a.rows.split(",")]:
        eng, plain = [], []
        for r in range(a.repeats):
            prefix = fresh(a.prefix)
            # Lengths never repeat between repeats, as real sessions' do not (a kernel graph
            # built for one length would make the next repeat look cheaper than it is).
            hist = [prefix + fresh(i * a.history + 7 * r + 1) for i in range(k)]
            run(hist)  # each session's history is cached (its previous turn)
            if a.ssd:  # ...and written behind to the SSD tier, as between a worker's turns
                _written(cache, k)
            news = [h + fresh(a.new) for h in hist]
            if phases is not None:
                phases.reset()
            eng.append(max(run(news)))
            if phases is not None and a.phases:
                print(f"K={k}:\n{phases.table(eng[-1])}\n", flush=True)
            plain.append(_plain(loaded.model, hist, a.new, fresh, make_prompt_cache, mx))
        e, p = statistics.median(eng), statistics.median(plain)
        tok = k * a.new
        print(
            f"| {k} | {_spread(eng, 3)} | {tok / e:,.0f} | {_spread(plain, 3)} | {tok / p:,.0f} | "
            f"{e / p:.2f}x | {(tok / e) / statistics.median(cold):.2f} |",
            flush=True,
        )
    engine.stop()
    engine.join(30)
    if ssd_dir is not None:
        import shutil

        cache.writes.flush()  # a write behind still running would leave its file
        shutil.rmtree(ssd_dir, ignore_errors=True)
    # As the worker does (mlxd/worker/__main__.py): skip the interpreter's teardown, where
    # MLX's per-thread streams of the engine thread abort a clean exit ("terminate called").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _written(cache, k: int, timeout_s: float = 120.0) -> None:
    """Wait until the write-behind has written `k` more entries (the engine's idle upkeep
    hands them to the writer)."""
    start = cache.stats().get("cache_ssd_writes", 0)
    until = time.monotonic() + timeout_s
    while cache.stats().get("cache_ssd_writes", 0) < start + k and time.monotonic() < until:
        time.sleep(0.05)
    cache.writes.flush()


def _plain(model, hist, new: int, fresh, make_prompt_cache, mx) -> float:
    """Seconds for the extensions one row after another on plain caches (history prefilled
    outside the timing)."""
    caches = []
    for h in hist:
        c = make_prompt_cache(model)
        model(mx.array([h[:-1]]), cache=c)
        mx.eval([x.state for x in c])
        caches.append(c)
    ext = [fresh(new) for _ in hist]
    mx.synchronize()
    t0 = time.perf_counter()
    for h, c, e in zip(hist, caches, ext, strict=True):
        logits = model(mx.array([[h[-1], *e]]), cache=c)[:, -1, :]
        mx.eval(mx.argmax(logits, axis=-1))
    return time.perf_counter() - t0


def _spread(xs: list[float], digits: int = 0) -> str:
    m = statistics.median(xs)
    return f"{m:,.{digits}f} ({min(xs):,.{digits}f}-{max(xs):,.{digits}f})"
