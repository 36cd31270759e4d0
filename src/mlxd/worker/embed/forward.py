"""One embedding request's forwards, run on the engine thread (the owner of every MLX object).

Rows are right-padded: the backbone's attention is causal, so padding after a row's last
token cannot change any of that row's hidden states, and pooling reads only real positions.
That is why a batched vector equals the one-by-one vector (up to float rounding).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from mlxd.shared.errors import MlxdError, Unavailable
from mlxd.shared.model_facts import Pooling
from mlxd.worker.embed.load import backbone
from mlxd.worker.embed.plan import Forward

log = logging.getLogger("mlxd.worker.embed")

FAILED = "The embedding forward failed; the worker log has the details"


class EmbedRun:
    """Pooled, unnormalized float32 vectors of `tokens`, filled in forward by forward.

    Only the engine thread calls `step`; the event loop reads `vectors` once every forward
    of the plan has completed."""

    def __init__(self, model: Any, tokens: list[list[int]], pooling: Pooling):
        self.model = model
        self.backbone = backbone(model)
        self.tokens = tokens
        self.pooling = pooling
        self.vectors: list[np.ndarray | None] = [None] * len(tokens)
        self._left = len(tokens)  # vectors still to fill
        self._cache: list | None = None  # a long input's KV over its chunks
        self._sum: mx.array | None = None  # a long input's hidden-state sum (mean pooling)

    def step(self, fwd: Forward) -> None:
        """Run one forward of the plan (chunks of a long input come in order)."""
        self._forward(fwd)
        if self._left == 0:
            # Forwards of many shapes leave MLX's buffer cache holding sizes the next request
            # may never ask for (a soak grew a worker 161 -> 344 MB): give them back, once
            # this request's arrays are gone (the forward's own went as it returned).
            mx.clear_cache()

    def _forward(self, fwd: Forward) -> None:
        rows = [self.tokens[i][fwd.start : fwd.stop] for i in fwd.indices]
        lengths = [len(r) for r in rows]
        width = max(lengths)
        ids = mx.array([r + [0] * (width - len(r)) for r in rows])
        if fwd.chunked and fwd.start == 0:
            self._cache, self._sum = make_prompt_cache(self.model), None
        h = self.backbone(ids, cache=self._cache) if fwd.chunked else self.backbone(ids)
        h = h.astype(mx.float32)
        if fwd.chunked:
            pooled = self._chunk_pool(h, fwd)
        else:
            pooled = _pool(h, lengths, self.pooling)
        if pooled is None:  # a middle chunk: compute it now, its state lives on in the cache
            pending = [c.state for c in self._cache or []]
            mx.eval(pending if self._sum is None else [*pending, self._sum])
            return
        out = np.array(pooled)
        for row, i in enumerate(fwd.indices):
            self.vectors[i] = out[row]
        self._left -= len(fwd.indices)

    def _chunk_pool(self, h: mx.array, fwd: Forward) -> mx.array | None:
        if self.pooling == "mean":
            part = h[0].sum(axis=0, keepdims=True)
            self._sum = part if self._sum is None else self._sum + part
        elif self.pooling == "cls" and fwd.start == 0:
            self._sum = h[:, 0]
        if not fwd.last_chunk:
            return None
        if self.pooling == "mean":
            assert self._sum is not None
            pooled = self._sum / len(self.tokens[fwd.indices[0]])
        elif self.pooling == "cls":
            assert self._sum is not None  # taken at the first chunk (start 0)
            pooled = self._sum
        else:
            pooled = h[:, -1]
        self._cache, self._sum = None, None
        return pooled


def _pool(h: mx.array, lengths: list[int], pooling: Pooling) -> mx.array:
    """(rows, width, hidden) → (rows, hidden), reading each row's real positions only."""
    if pooling == "cls":
        return h[:, 0]
    if pooling == "last":
        return h[mx.arange(h.shape[0]), mx.array([n - 1 for n in lengths])]
    mask = mx.arange(h.shape[1])[None, :] < mx.array(lengths)[:, None]
    return (h * mask[..., None]).sum(axis=1) / mx.array(lengths, mx.float32)[:, None]


class EmbedStep:
    """One forward of an EmbedRun as an engine inbox job; its result reaches the event loop's
    future (None when done, else the error)."""

    def __init__(self, run: EmbedRun, fwd: Forward, loop: asyncio.AbstractEventLoop):
        self.run_ = run
        self.fwd = fwd
        self._loop = loop
        self.done: asyncio.Future[None] = loop.create_future()

    def run(self, stream) -> None:
        """On the engine thread: the forward, then the answer to the loop. Never raises."""
        try:
            with mx.stream(stream):
                self.run_.step(self.fwd)
        except MlxdError as err:
            self.fail(err)
        except Exception as exc:
            log.exception("embedding forward failed")
            memory = "memory" in str(exc).lower()
            self.fail(Unavailable("Out of memory for this embedding batch") if memory else None)
        else:
            self._loop.call_soon_threadsafe(self._settle, None)

    def fail(self, err: MlxdError | None) -> None:
        """Answer with `err` (None: the generic failure); any thread."""
        self._loop.call_soon_threadsafe(self._settle, err or MlxdError(FAILED))

    def _settle(self, err: MlxdError | None) -> None:
        if self.done.done():  # the request was cancelled meanwhile
            return
        if err is None:
            self.done.set_result(None)
        else:
            self.done.set_exception(err)
