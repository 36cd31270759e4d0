"""Admission: a submission becomes a row of the batch.

Its sampler and logits processors (each guarded, so its failure stays its own), the longest
prefix the prompt cache holds for it, and the prompt tokens left to prefill, cut into segments
by `prompt_segments`; how many of them each step prefills is the planner's (planner.py).
"""

from __future__ import annotations

from mlxd.worker.engine.batch import Batch
from mlxd.worker.engine.recovery import guard_processor, guard_sampler
from mlxd.worker.engine.rows import Row, Submission
from mlxd.worker.engine.step.sampling import RowSampling, make_row_processors
from mlxd.worker.engine.textstream import TextStream, make_detokenizer


def admit(batch: Batch, sub: Submission, tokenizer) -> Row:
    """Insert `sub` into the batch; raises on a bad restore or an MLX error (this row only)."""
    p = sub.params
    sampling = RowSampling(p)
    sampler = guard_sampler(sub, sampling, batch.broken)
    processors = make_row_processors(
        sampling,
        [guard_processor(sub, f, batch.broken) for f in sub.processors],
        guard=lambda f: guard_processor(sub, f, batch.broken),
    )
    layers, n = None, 0
    if batch.cache is not None:
        layers, n, _ = batch.cache.fetch(sub.ns, sub.prompt, sub.restored)
        sub.restored = None  # let the arrays go
    sub.prompt_cached = sub.prompt_done = n
    slot = batch.slot_for(sub)  # an unknown adapter fails this row before it is inserted
    images = batch.images_for(sub, n)  # so does an image the vision tower cannot encode
    assert p.max_tokens is not None  # resolve_params fixed it before the submission
    assert batch.eos is not None  # set with the generator
    uid = batch.insert(
        prompt_segments(sub, n, batch.trimmable),
        # mlx-lm fills a None entry with fresh caches (its own default)
        caches=[layers],
        all_tokens=[list(sub.prompt[:n])],
        max_tokens=[p.max_tokens],
        samplers=[sampler],
        logits_processors=[processors],
        stop_sequences=[batch.eos],
    )
    row = Row(
        sub=sub,
        uid=uid,
        text=TextStream(make_detokenizer(tokenizer), p.stop),
        sampler=sampler,
        processors=processors,
        pos=n,
        todo=len(sub.prompt) - n - batch.held_back,
        slot=slot,
    )
    batch.add(row, images)
    return row


def prompt_segments(sub: Submission, cached: int, trimmable: bool) -> list[list[int]]:
    """The prompt tokens past the `cached` prefix, as segments the batch prefills in order.

    A cache that cannot be trimmed is only reusable at exact prompt ends, so the prompt is cut
    at its stable boundary (where the next turn's prompt still matches) to snapshot it there.
    """
    if not trimmable and cached < sub.boundary < len(sub.prompt):
        return [sub.prompt[cached : sub.boundary], sub.prompt[sub.boundary :]]
    return [sub.prompt[cached:]]
