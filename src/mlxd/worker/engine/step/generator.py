"""The one place a generator is made: mlx-lm's BatchGenerator with our decode batch in it.

mlx-lm's BatchGenerator calls only `uids`, `tokens`, `prompt_cache`, `__len__`, `extend`,
`filter`, `extract_cache` and `next` on its generation batch; DecodeBatch (decode.py) provides
those. How it is put in place is the seam's (mlx_lm_seam/).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import cast

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from mlxd.worker.engine.step.decode import DecodeBatch
from mlxd.worker.engine.step.speculate import SpecConfig
from mlxd.worker.model import mlx_lm_seam as seam
from mlxd.worker.model.head import Site


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
    decode = DecodeBatch(model, spec, compiled)
    return seam.new_generator(model, batch=batch, chunk=chunk, stream=stream, decode_batch=decode)


def decode_batch(gen: BatchGenerator) -> DecodeBatch:
    """The generator's decode batch (for log-probability requests and the profile clock)."""
    return seam.decode_batch_of(gen)


def first_tokens(gen: BatchGenerator) -> list[tuple[int, int, mx.array | None]]:
    """(uid, first token, its log-probabilities or None) of the rows the decode batch took
    in during this step, read now.

    mlx-lm returns a row's first token from the decode step after the one that sampled it:
    behind that step's forward and behind the prefill chunk the same step runs for rows
    still prefilling (up to a whole chunk of someone else's prompt). The token is sampled
    already: from the prefill forward's logits, whose evaluation this step waited for (or
    from a forward of the last prompt token, launched in this step), so the engine sends it
    at the end of this step instead (emit.send_first)."""
    d = decode_batch(gen)
    if not d.arrived:  # most steps: nobody entered decoding
        return []
    arrived, d.arrived = d.arrived, []
    live = set(d.uids)
    out = []
    for uids, toks, lps in arrived:
        ids = cast(list[int], toks.tolist())  # mlx's stub: tolist() is list or scalar
        for j, (u, t) in enumerate(zip(uids, ids, strict=True)):
            if u in live:
                out.append((u, t, lps[j] if len(lps) == len(uids) else None))
    return out


def step(gen: BatchGenerator, hand_over_early: bool, head: Site | None = None) -> tuple[list, list]:
    """One step of the generator: (prompt responses, decode responses). `hand_over_early`
    (trimmable caches): rows whose prefill ended in this step go to the decode batch in it
    (mlx_lm_seam.hand_over_prompted), a step sooner than mlx-lm's own order. `head` (the
    model's output head, with hand_over_early): rows inserted with their last prompt token
    folded in (Batch.insert) take their first token from their prefill forward's logits
    instead of a decode forward of that token (mlx_lm_seam.folding)."""
    with seam.folding(gen, head) if head is not None else nullcontext():
        prompt_responses, responses = gen.next()
        if hand_over_early:
            prompt_responses = [*prompt_responses, *seam.hand_over_prompted(gen)]
    return prompt_responses, responses
