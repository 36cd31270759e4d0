"""Our PromptProcessingBatch.prompt, where mlx-lm's does not do what we need.

mlx-lm's steps, in its order: record the chunk's tokens as the rows' cached tokens, right-pad
the rows to one width, prefill in `prefill_step_size` pieces, roll the padding to the left.
Two things differ, each only where asked (mlx_lm_seam/prompts.py decides; otherwise mlx-lm's own
prompt runs):

- the width is rounded up to whole blocks while `blocks.block` is set (blocks.py);
- with `site` (head.py), the chunk is one forward whose head runs on each row's last real
  position, and the logits there come back (B, vocabulary): the first-token logits of rows
  whose prompt ends in this chunk (engine/step/generator.py), with no decode forward after.
"""

from __future__ import annotations

import mlx.core as mx

from mlxd.worker.model import blocks, head


def prompt(batch, tokens: list[list[int]], site: head.Site | None = None) -> mx.array | None:
    """Prefill `tokens` (one chunk per row) into `batch`'s caches; with `site`, return each
    row's logits at its chunk's last token."""
    if len(batch.uids) != len(tokens):
        raise ValueError("The batch length doesn't match the number of inputs")
    for done, new in zip(batch.tokens, tokens, strict=True):
        done += new
    lengths = [len(t) for t in tokens]
    width = blocks.round_up(max(lengths)) if blocks.block > 0 else max(lengths)
    padding = [width - n for n in lengths]
    ids = mx.array([t + [0] * p for t, p in zip(tokens, padding, strict=True)])
    if max(padding) > 0:
        for c in batch.prompt_cache:
            c.prepare(lengths=lengths, right_padding=padding)
    logits = None
    if site is not None:  # one forward: every row's last position lies inside it
        with head.gathered(site, mx.array([n - 1 for n in lengths])):
            logits = batch.model(ids, cache=batch.prompt_cache)[:, -1, :]
        mx.eval([c.state for c in batch.prompt_cache], logits)
        mx.clear_cache()
    else:
        while ids.shape[1] > 0:
            n = min(batch.prefill_step_size, ids.shape[1])
            batch.model(ids[:, :n], cache=batch.prompt_cache)
            mx.eval([c.state for c in batch.prompt_cache])
            mx.clear_cache()
            ids = ids[:, n:]
    if max(padding) > 0:
        for c in batch.prompt_cache:
            c.finalize()
        mx.eval([c.state for c in batch.prompt_cache])
        mx.clear_cache()
    return logits
