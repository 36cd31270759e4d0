"""Whether a model's rows may be prefilled together: mlx-lm pads the rows of one prefill
forward to a common length, and a model whose layers ignore that padding gives a short row
the logits of its padding too (nemotron_h's Mamba2 layers in mlx-lm 0.32.2: its `_ssm` never
reads the cache's `lengths`, which granitemoehybrid's passes on).

Checked once at load, on the model itself: two rows of different lengths prefilled together
against each alone. A model that fails is served with one row prefilling at a time (its decode
stays batched: one token per row needs no padding), so its output stays mlx-lm's single-row
greedy output. Plain attention caches mask their padding (mlx-lm's BatchKVCache): they are not
probed, which keeps the common model's load as it was.
"""

from __future__ import annotations

import logging

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, generate_step
from mlx_lm.models.cache import make_prompt_cache

from mlxd.worker.kv.layers import attention_only

log = logging.getLogger("mlxd.worker.model")

# Two prompts of different lengths (ids every vocabulary has), so one of them is padded.
PROBE_PROMPTS = ([11, 12, 13, 14], list(range(20, 31)))
# Mean absolute difference of log-probabilities, in nats, above which a padded row's logits
# are not its own: padding that leaks into a row's state moves its whole distribution (~10
# nats on the tiny hybrid), where batched float arithmetic moves it by hundredths.
MAX_MEAN_DIFF = 0.25


def padded_prefill_agrees(model) -> bool:
    """Whether rows prefilled together get the first-token logits each gets alone."""
    if attention_only(make_prompt_cache(model)):
        return True
    alone = [next(generate_step(mx.array(p), model, max_tokens=1))[1] for p in PROBE_PROMPTS]
    gen = BatchGenerator(model, max_tokens=1)
    try:
        uids = gen.insert([list(p) for p in PROBE_PROMPTS])
        together: dict[int, mx.array] = {}
        while len(together) < len(uids):
            for r in gen.next_generated():
                together[r.uid] = r.logprobs
    finally:
        gen.close()
    worst = max(
        float(mx.abs(together[u].astype(mx.float32) - a.astype(mx.float32)).mean())
        for u, a in zip(uids, alone)
    )
    if worst > MAX_MEAN_DIFF:
        log.warning(
            "this model's rows are prefilled one at a time: prefilled together, a padded"
            " row's logits move by %.2f nats on average (its layers do not mask padding)",
            worst,
        )
        return False
    return True
