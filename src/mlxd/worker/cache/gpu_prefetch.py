"""A restored SSD entry's bytes moved into GPU memory before the engine reads them (CUDA).

On MLX's CUDA backend an SSD restore reads the data file into CUDA managed memory
(kv_arrays.mlx_bytes: arrays made on the CPU stream are managed), so the KV tensors need no
copy to become MLX arrays. Those pages are written by the CPU and live in host memory; the
engine's first step after the restore then reads every one of them from a GPU kernel, and
each read faults its page over the bus one fault at a time. `to_gpu` asks the driver to
migrate the whole range in one bulk transfer instead (cuMemPrefetchAsync, a copy engine at
bus speed), on the reading thread, so the engine's step starts with the KV already on the
GPU. Nothing else MLX does moves managed memory ahead of use.

Anywhere else (Apple silicon's unified memory, the CPU backend, a driver without the call)
it does nothing and says so by returning False: the restore stays correct either way, only
the first step's faults differ.
"""

from __future__ import annotations

import ctypes
import logging
import threading

import mlx.core as mx
import numpy as np

log = logging.getLogger(__name__)

_LOCATION_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE


class _Location(ctypes.Structure):  # CUmemLocation
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _Driver:
    """The few CUDA driver calls a prefetch needs, found in libcuda at first use."""

    def __init__(self, lib: ctypes.CDLL, device: int):
        self.lib = lib
        self.device = device
        self.ctx = ctypes.c_void_p()
        dev = ctypes.c_int()
        _check(lib.cuInit(0), "cuInit")
        _check(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev), "primary context")
        self.v2 = hasattr(lib, "cuMemPrefetchAsync_v2")

    def prefetch(self, ptr: int, size: int) -> None:
        lib = self.lib
        _check(lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")  # the calling thread's
        if self.v2:
            where = _Location(_LOCATION_DEVICE, self.device)
            rc = lib.cuMemPrefetchAsync_v2(
                ctypes.c_uint64(ptr), ctypes.c_size_t(size), where, ctypes.c_uint(0), None
            )
        else:
            rc = lib.cuMemPrefetchAsync(
                ctypes.c_uint64(ptr), ctypes.c_size_t(size), ctypes.c_int(self.device), None
            )
        _check(rc, "cuMemPrefetchAsync")
        _check(lib.cuStreamSynchronize(None), "cuStreamSynchronize")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise OSError(f"{what} failed (CUresult {rc})")


_driver: _Driver | None | bool = None  # None: not looked for yet; False: not available
_lock = threading.Lock()


def _find() -> _Driver | bool:
    if mx.default_device() != mx.gpu or not mx.cuda.is_available():
        return False
    try:
        return _Driver(ctypes.CDLL("libcuda.so.1"), mx.default_device().index)
    except (OSError, AttributeError) as exc:
        log.info("SSD restores fault their pages onto the GPU (no prefetch: %s)", exc)
        return False


def to_gpu(buf: np.ndarray) -> bool:
    """Migrate `buf`'s memory (managed, from `mlx_bytes`) to the GPU and wait for it; True
    when it moved. Any thread; never raises (a failed prefetch only leaves the faults)."""
    global _driver
    with _lock:
        if _driver is None:
            _driver = _find()
        drv = _driver
    if not isinstance(drv, _Driver) or buf.nbytes == 0:
        return False
    try:
        drv.prefetch(buf.ctypes.data, buf.nbytes)
    except OSError as exc:  # not managed memory (NumPy's fallback), or the driver refused
        log.info("SSD restore prefetch skipped: %s", exc)
        return False
    return True
