"""`python -m bench.cuda_memory`: how bytes from a file get into GPU memory under MLX's CUDA
backend, way by way (issue 34: an SSD restore of gemma3-12b spent ~0.77 s reading 1.36 GB
into MLX memory where the same read into NumPy memory took 0.23 s).

On CUDA, MLX gives arrays made on the CPU stream managed memory (cudaMallocManaged) and
arrays made on the GPU stream device memory. Each line below times one way, in a fresh
buffer unless it says otherwise, on `--mib` MiB:

- zeros: `mx.zeros` on the CPU stream (one thread touches every new managed page), then
  the same size again after freeing it (MLX's buffer cache hands the pages back);
- zeros split over `--streams` CPU streams at once (their threads touch the pages together);
- pread of a page-cached file into NumPy memory, into managed memory already touched;
- a GPU copy (`x * 1` on the GPU stream) of a managed buffer the CPU wrote (the pages
  fault over), then the CPU writing that buffer again (they fault back);
- the same after cuMemAdvise (preferred location the CPU, accessed by the GPU): the GPU
  reads over the bus and nothing migrates;
- `mx.array(numpy)`: MLX's own copy into a fresh managed buffer;
- and what the restore's read costs without MLX: the file read and hashed in 4 MiB pieces on
  8 or 16 threads (digest.read_hashed), and one thread's SHA-256 speed.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import tempfile
import threading
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlxd.worker.cache import digest

WORD = 8


def timed(name: str, nbytes: int, fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    s = time.perf_counter() - t
    print(f"| {name} | {s * 1e3:.1f} | {nbytes / s / 1e9:.2f} |", flush=True)
    return out


def managed(nbytes: int, stream=None) -> mx.array:
    x = mx.zeros((nbytes // WORD,), dtype=mx.uint64, stream=stream or mx.cpu)
    mx.eval(x)
    return x


def host_view(x: mx.array) -> np.ndarray:
    return np.asarray(memoryview(x)).view(np.uint8)  # type: ignore[arg-type]


def pread_into(path: str, buf: np.ndarray, threads: int = 8) -> None:
    fd = os.open(path, os.O_RDONLY)
    n = len(buf)
    step = -(-n // threads)
    mv = memoryview(buf)

    def part(a: int) -> None:
        b = min(a + step, n)
        done = a
        while done < b:
            done += os.preadv(fd, [mv[done:b]], done)

    ts = [threading.Thread(target=part, args=(a,)) for a in range(0, n, step)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    os.close(fd)


def gpu_copy(x: mx.array) -> mx.array:
    y = mx.multiply(x, mx.array(1, dtype=x.dtype), stream=mx.default_device())
    mx.eval(y)
    return y


def advise_cpu_resident(buf: np.ndarray) -> str:
    """cuMemAdvise: preferred location the host, accessed by device 0; '' or why not."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")

        class Loc(ctypes.Structure):
            _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

        ctx, dev = ctypes.c_void_p(), ctypes.c_int()
        lib.cuInit(0)
        lib.cuDeviceGet(ctypes.byref(dev), 0)
        lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
        lib.cuCtxSetCurrent(ctx)
        ptr, n = ctypes.c_uint64(buf.ctypes.data), ctypes.c_size_t(buf.nbytes)
        # CU_MEM_ADVISE_SET_PREFERRED_LOCATION = 3, SET_ACCESSED_BY = 5; host = type 2 (HOST)
        if hasattr(lib, "cuMemAdvise_v2"):
            r1 = lib.cuMemAdvise_v2(ptr, n, 3, Loc(2, 0))
            r2 = lib.cuMemAdvise_v2(ptr, n, 5, Loc(1, 0))
        else:
            r1 = lib.cuMemAdvise(ptr, n, 3, ctypes.c_int(-1))  # CU_DEVICE_CPU
            r2 = lib.cuMemAdvise(ptr, n, 5, ctypes.c_int(0))
        return "" if r1 == r2 == 0 else f"CUresult {r1}, {r2}"
    except OSError as exc:
        return str(exc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=1362)
    p.add_argument("--streams", type=int, default=8)
    a = p.parse_args()
    n = a.mib << 20
    print(f"mlx {mx.__version__} on {mx.default_device()}, {a.mib} MiB\n")
    print("| way | ms | GB/s |\n|---|---:|---:|")
    with tempfile.NamedTemporaryFile(dir=os.environ.get("TMPDIR")) as f:
        f.write(np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8).tobytes())
        f.flush()
        path = f.name
        host = np.empty(n, dtype=np.uint8)
        timed("pread, 8 threads, into NumPy memory (fresh)", n, pread_into, path, host)
        timed("pread, 8 threads, into NumPy memory (again)", n, pread_into, path, host)
        for threads in (8, 16):
            timed(f"read + SHA-256 per 4 MiB piece, {threads} threads", n, hashed, path, threads)
        timed("SHA-256 of 64 MiB in memory, one thread", 64 << 20, sha, host[: 64 << 20])

        x = timed("mx.zeros on the CPU stream (fresh managed pages)", n, managed, n)
        timed("pread, 8 threads, into that managed buffer", n, pread_into, path, host_view(x))
        x = None
        x = timed("mx.zeros on the CPU stream again (MLX's cache)", n, managed, n)
        x = None
        mx.clear_cache()
        timed(f"mx.zeros over {a.streams} CPU streams at once (fresh)", n, split, n, a.streams)
        mx.clear_cache()

        for advised in (False, True):
            x = managed(n)
            buf = host_view(x)
            what = "advised: " if advised else ""
            if advised:
                why = advise_cpu_resident(buf)
                print(f"| (cuMemAdvise: {why or 'ok'}) | | |")
            pread_into(path, buf)
            timed(f"{what}GPU copy of a managed buffer the CPU wrote", n, gpu_copy, x)
            timed(f"{what}the CPU writes that buffer again", n, pread_into, path, buf)
            timed(f"{what}GPU copy again", n, gpu_copy, x)
            x = buf = None
            mx.clear_cache()
        timed("mx.array(numpy): MLX's copy into fresh managed memory", n, mlx_copy, host)


def hashed(path: str, threads: int) -> None:
    """What digest.read_hashed does with `threads` threads, into NumPy memory."""
    digest.MAX_THREADS = threads
    digest._pool = None
    digest.read_hashed(Path(path), digest.PIECE_BYTES)


def sha(data: np.ndarray) -> None:
    hashlib.sha256(memoryview(data)).digest()


def split(n: int, streams: int) -> list:
    """Fresh managed pages zeroed by `streams` CPU streams' threads at once."""
    each = [mx.new_stream(mx.cpu) for _ in range(streams)]
    parts = [mx.zeros((n // WORD // streams,), mx.uint64, stream=s) for s in each]
    mx.eval(parts)
    return parts


def mlx_copy(host: np.ndarray) -> mx.array:
    z = mx.array(host)
    mx.eval(z)
    return z


if __name__ == "__main__":
    main()
