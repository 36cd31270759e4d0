"""`python -m bench.restore`: where an SSD prompt-cache entry's write and restore go (issue 34).

    python -m bench.restore                        # gemma3-12b's KV per token, 12 of 48 layers
    python -m bench.restore --layers 48            # the whole 12B layout (about 1.5 GB)
    python -m bench.restore --cold                 # restore from disk, not the page cache
    python -m bench.restore --before               # the code before issue 34's changes
    python -m bench.restore --copy                 # read into NumPy memory, mx.array copies
    python -m bench.restore --runs 3               # copy and after: 3 processes each

No model and no HTTP: the caches are made the way the engine makes them (mlx-lm's
RotatingKVCache and KVCache fed through `update_and_fetch`: turn 1 prefilled in chunks of
`--chunk`, `--reply` tokens decoded one at a time, then turn 2's `--user` tokens in one
chunk up to its segment end, where the engine stores its snapshot), then stored and restored
through the real SsdStore and PromptCache, each phase timed on its own, then the whole path
(SsdStore.read + PromptCache.fetch) once more end to end. Last, the engine's first step on the
restored caches (each layer extended by `--user` tokens and read whole, on the default
device), then the same step on caches that never left it (what a RAM hit's step costs): on
CUDA the restored bytes sit in managed memory the CPU wrote, and that step faults them over.
Layers follow gemma3: every `--pattern`-th layer global, the rest windows of `--window`;
8 KV heads x 256 head dim, bf16.

`--before` times what the code did before: windows kept whole (no `entry_caches.window_only`), the
data file hashed whole by one thread, read with `read_bytes` and parsed by safetensors'
`load` (a copy of every tensor, holding the GIL). Run each in a process of its own: a second
restore in one process reuses freed memory and skips the page faults a fresh worker pays.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import mlx.core as mx
import numpy as np
import safetensors.numpy as stnp
from mlx_lm.models.cache import KVCache, RotatingKVCache

from mlxd.worker.cache import entry_caches, ssd
from mlxd.worker.cache import format as fmt
from mlxd.worker.cache.digest import read_hashed
from mlxd.worker.cache.kv_arrays import _layer_layout, from_numpy, mlx_buffers, to_numpy
from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.cache.restore_read import read_tensors
from mlxd.worker.cache.safetensors_file import tensor_views

MB = 1 << 20


def make_caches(a) -> list:
    """Caches as a row leaves them after turn 1 (prefill + decode) and turn 2's new part."""
    rows = []
    shape = (1, a.kv_heads, a.chunk, a.head_dim)
    block = mx.random.normal(shape).astype(mx.bfloat16)  # values do not matter, sizes do
    mx.eval(block)
    steps = []
    left = a.turn
    while left:
        steps.append(min(a.chunk, left))
        left -= steps[-1]
    steps += [1] * a.reply + [a.user]
    for i in range(a.layers):
        glob = (i + 1) % a.pattern == 0
        c = KVCache() if glob else RotatingKVCache(max_size=a.window)
        for n in steps:
            x = block[:, :, :n, :]
            c.update_and_fetch(x, x)
            mx.eval(c.keys, c.values)
        rows.append(c)
    return rows


class Phases:
    def __init__(self):
        self.rows: list[tuple[str, float]] = []

    @contextmanager
    def __call__(self, name: str):
        t = time.perf_counter()
        yield
        self.rows.append((name, time.perf_counter() - t))

    def table(self, title: str, nbytes: int) -> str:
        total = sum(s for _, s in self.rows)
        out = [f"\n{title}\n", "| phase | ms | share | GB/s of the entry |", "|---|---:|---:|---:|"]
        for name, s in self.rows:
            rate = nbytes / s / 1e9 if s > 0 else float("inf")
            out.append(f"| {name} | {s * 1e3:.1f} | {100 * s / total:.0f}% | {rate:.2f} |")
        out.append(f"| **sum** | **{total * 1e3:.1f}** | | {nbytes / total / 1e9:.2f} |")
        return "\n".join(out)


def drop_page_cache(path: Path) -> None:
    """Evict a (clean, fsynced) file's pages so the next read comes from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--pattern", type=int, default=6, help="every n-th layer is global")
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=256)
    p.add_argument("--turn", type=int, default=16384, help="turn 1's prompt tokens")
    p.add_argument("--reply", type=int, default=32, help="turn 1's decoded tokens")
    p.add_argument("--user", type=int, default=256, help="turn 2's new tokens (one chunk)")
    p.add_argument("--chunk", type=int, default=4096, help="prefill chunk (GPU default)")
    p.add_argument("--cold", action="store_true", help="evict the file from the page cache")
    p.add_argument("--dir", type=Path, default=None, help="where to write (default: a tmp dir)")
    p.add_argument("--before", action="store_true", help="the code before issue 34's changes")
    p.add_argument(
        "--copy", action="store_true", help="read into NumPy memory, then mx.array copies"
    )
    p.add_argument("--runs", type=int, default=0, help="each mode in N processes")
    p.add_argument("--modes", default="copy,after", help="what --runs compares")
    p.add_argument("--json", type=Path, default=None, help="append this run's phases here")
    a = p.parse_args()
    if a.runs:
        return medians(a.runs, a.modes.split(","))
    if a.before:
        entry_caches.window_only = lambda c: c
        fmt.PIECE_BYTES = ssd.PIECE_BYTES = 0

    caches = make_caches(a)
    n_tokens = a.turn + a.reply + a.user
    tokens = tuple(int(t) for t in np.random.default_rng(0).integers(0, 200_000, n_tokens))
    layout = tuple(_layer_layout(c) for c in caches)
    held = {type(c).__name__: c.keys.shape[2] for c in entry_caches.compact(caches)}
    print(f"{'before' if a.before else 'after'}: {a.layers} layers, {n_tokens} tokens")
    print(f"positions an entry holds per layer kind: {held}")

    root = Path(tempfile.mkdtemp(dir=a.dir, prefix="restore-"))
    pc = PromptCache(8 << 30, root / "ssd", 64 << 30, layout=layout)
    pc.start()
    store = pc.ssd
    assert store is not None
    if a.copy:
        store.buffers = None  # one NumPy buffer: the restore copies, as before this change

    # -- write: what WritePolicy.enqueue and the writer thread do ----------------------------
    w = Phases()
    with w("compact (RAM insert)"):
        layers = entry_caches.compact(caches)
    with w("to_numpy (contiguous, eval, views)"):
        arrays, meta, _keep = to_numpy(layers)
    with w("encode_entry (header, digest)"):
        parts, sidecar, size, digest = fmt.encode_entry("", tokens, arrays, meta, None)
    key = fmt.entry_key("", tokens)
    with w("write data file + fsync"):
        fmt.write_atomic(fmt.data_path(store.dir, key), *parts)
    with w("write sidecar + fsync, folder fsync"):
        fmt.write_atomic(fmt.meta_path(store.dir, key), sidecar)
        fmt.fsync_dir(store.dir)
    print(w.table(f"write, {size / MB:.0f} MiB data file", size))
    mode = "before" if a.before else "copy" if a.copy else "after"
    store.scan()  # index it as a restart would
    e, covered = store.best("", list(tokens) + [1, 2, 3])
    assert e is not None and covered == n_tokens

    # -- restore: make_cache_key's read off the engine thread, then PromptCache.fetch ---------
    path = fmt.data_path(store.dir, key)
    if a.cold:
        drop_page_cache(path)
    r = Phases()
    where = " (cold)" if a.cold else " (page cache)"
    if a.before:
        with r("read_bytes" + where):
            data = path.read_bytes()
        with r("SHA-256 of the data (1 thread)"):
            ok = len(data) == e.file_bytes and hashlib.sha256(data).hexdigest() == e.sha256
        assert ok
        with r("safetensors load (copies out)"):
            got = stnp.load(data)
    elif a.copy:
        with r(f"read + digest, pieces on threads, one NumPy buffer{where}"):
            buf, digest = read_hashed(path, e.piece_bytes)
        assert len(buf) == e.file_bytes and digest == e.sha256
        with r("tensor views (no copy)"):
            got = tensor_views(buf)
    else:
        with r(f"read + digest, pieces on threads, an MLX array per tensor{where}"):
            size, got, digest = read_tensors(path, e.piece_bytes, mlx_buffers)
        assert size == e.file_bytes and digest == e.sha256
    with r("token ids check"):
        assert tuple(got.pop(fmt.TOKENS_TENSOR).tolist()) == e.tokens
    with r("check_layout (read)"):
        fmt.check_layout(got, layout, n_tokens)
    with r("check_layout (engine, again)"):
        fmt.check_layout(got, layout, n_tokens)
    copies = "mx.array copies" if a.before or a.copy else "MLX views, no copy"
    with r(f"from_numpy ({copies}, eval)"):
        restored = from_numpy(got, layout)
    with r("RAM insert"):
        pc.ram.insert("", e.tokens, restored, None, True)
    prompt = list(tokens) + [1, 2, 3]
    with r("RAM fetch (view: deepcopy)"):
        hit, n = pc.ram.fetch("", prompt)
    assert hit is not None and n == n_tokens
    with r("first step on the restored KV (reads it all)"):
        first_step(hit, a)
    print(r.table(f"restore, {e.file_bytes / MB:.0f} MiB data file", e.file_bytes))
    resident = [copy.deepcopy(c) for c in layers]
    mx.eval([c.state for c in resident])
    t = time.perf_counter()
    first_step(resident, a)
    t_resident = time.perf_counter() - t
    print(f"\nthe same first step on KV that never left the device: {t_resident * 1e3:.1f} ms")
    if a.json is not None:
        with open(a.json, "a") as f:
            row = {"mode": mode, "bytes": e.file_bytes, "write": w.rows, "restore": r.rows}
            row["resident_step"] = t_resident
            f.write(json.dumps(row) + "\n")

    # -- the same, end to end through the real code -------------------------------------------
    del got, restored, hit, resident
    if a.before:  # SsdStore.read is today's: nothing to say of the old one end to end
        return
    pc.ram.drop(pc.ram.best("", prompt)[0])  # type: ignore[arg-type]
    if a.cold:
        drop_page_cache(path)
    t = time.perf_counter()
    arr = store.read(e)
    t_read = time.perf_counter() - t
    assert arr is not None
    layers2, n2, src = pc.fetch("", prompt, (e, arr))
    t_all = time.perf_counter() - t
    assert src == "ram" and n2 == n_tokens, (src, n2)
    print(
        f"\nend to end: SsdStore.read {t_read * 1e3:.0f} ms + PromptCache.fetch "
        f"{(t_all - t_read) * 1e3:.0f} ms = {t_all * 1e3:.0f} ms"
    )
    for left in store.dir.iterdir():
        left.unlink()


def first_step(layers: list, a) -> None:
    """What the engine's first step after a hit does to the KV: every layer extended by the
    turn's new tokens (`update_and_fetch`), then all of its keys and values read."""
    new = mx.ones((1, a.kv_heads, a.user, a.head_dim), dtype=mx.bfloat16)
    outs = []
    for c in layers:
        k, v = c.update_and_fetch(new, new)
        outs += [k.sum(), v.sum()]
    mx.eval(outs)


def medians(runs: int, modes: list[str]) -> None:
    """Each mode in turn, each in a fresh process, `runs` times; the median of each phase."""
    out = Path(tempfile.mkdtemp(prefix="restore-runs-")) / "runs.jsonl"
    args = list(sys.argv[1:])
    at = next(i for i, x in enumerate(args) if x.startswith("--runs"))
    del args[at : at + (1 if "=" in args[at] else 2)]
    for _ in range(runs):
        for mode in modes:
            flags = [] if mode == "after" else [f"--{mode}"]
            cmd = [sys.executable, "-m", "bench.restore", *args, *flags, "--json", str(out)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        for part in ("write", "restore"):
            p = Phases()
            for i, (name, _) in enumerate(mine[0][part]):
                p.rows.append((name, statistics.median(r[part][i][1] for r in mine)))
            title = f"{mode}: {part}, {mine[0]['bytes'] / MB:.0f} MiB, median of {len(mine)}"
            print(p.table(title, mine[0]["bytes"]))
        step = statistics.median(r["resident_step"] for r in mine)
        print(f"\n{mode}: the first step on KV that never left the device: {step * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
