"""The device a worker computes on, for the code paths that differ by it."""

from __future__ import annotations

import mlx.core as mx


def on_cuda() -> bool:
    """The default device is a CUDA GPU (not Metal's, not the CPU)."""
    return mx.default_device() == mx.gpu and mx.cuda.is_available()
