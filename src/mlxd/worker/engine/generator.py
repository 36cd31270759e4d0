"""The one place a generator is made: mlx-lm's BatchGenerator with our decode batch in it.

mlx-lm 0.32 internals used (pinned in pyproject.toml): the BatchGenerator keeps its decoding
rows in `_generation_batch` and calls only `uids`, `tokens`, `prompt_cache`, `__len__`,
`extend`, `filter`, `extract_cache` and `next` on it; DecodeBatch (decode.py) provides those.
"""

from __future__ import annotations

from mlx_lm.generate import BatchGenerator

from mlxd.worker.engine.decode import DecodeBatch, SpecConfig


def make_generator(
    model,
    *,
    batch: int,
    chunk: int,
    stream,
    spec: SpecConfig | None = None,
    compiled: bool = False,
) -> BatchGenerator:
    """A BatchGenerator of `batch` rows that prefills in `chunk`s and decodes through ours
    (speculating for a lone row when `spec` says how; the forward compiled if `compiled`)."""
    gen = BatchGenerator(
        model,
        completion_batch_size=batch,
        prefill_batch_size=batch,
        prefill_step_size=chunk,
        stream=stream,
    )
    gen._generation_batch = DecodeBatch(model, spec, compiled)
    return gen


def decode_batch(gen: BatchGenerator) -> DecodeBatch:
    """The generator's decode batch (for log-probability requests and the profile clock)."""
    return gen._generation_batch
