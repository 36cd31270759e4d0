"""Speculative decoding for a lone decoding row: draft k tokens, verify them in one forward.

The row's pending token y (sampled last step, not yet in the cache) and the drafts d1..dk go
through the target at once; position j's logits give the token z_j that plain decoding would
draw there, with the same sampler and, for a seeded row, the same key (a seeded row's key is
split once per position, as plain decoding splits it once per token). Drafts are accepted
while d_{j+1} == z_j; the first z_a that disagrees (or follows the last draft) is the next
pending token, and the k - a rejected positions are trimmed from the KV cache. So a row emits
exactly the tokens it would have without speculation (greedy or seeded), and an unseeded row
keeps its distribution (the chance a draft survives is the target's probability of it).

Only a lone row speculates (decode.py keeps it on plain, trimmable caches): in a batch, rows
accept different numbers of drafts, and mlx-lm's batch cache can only trim every row alike.
Batching already spends the weight traffic on several rows, which is what speculation buys
a lone row (docs/design.md). Rows with penalties or a grammar don't speculate: both read
the row's history, which drafts would change under them.

The verify forward always has k + 1 positions (short drafts are padded) and attends over the
cache's whole allocated buffer, masked (BucketView): its shapes change only every 256 tokens.
On MLX's CUDA backend every new (positions, key length) pair of a multi-token forward cost a
cuDNN graph build of ~60 ms; worker/attention.py now computes such small masked calls
unfused, and the fixed shapes still keep the number of shapes anything caches by small.

`SpecState.skip` backs off after misses, so a row whose text doesn't repeat (free writing
under prompt lookup) goes back to the pipelined step, which speculation gives up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from mlxd.worker.engine.step.draft import ModelDrafter, NgramDrafter
from mlxd.worker.engine.step.sampling import Table, key_after, penalize, sample

if TYPE_CHECKING:
    from mlxd.worker.engine.step.decode import DecodeBatch
    from mlxd.worker.engine.step.token import Token

MAX_SKIP = 16  # after repeated misses, try drafting again at least this often


@dataclass
class SpecStats:
    """Counters over the engine's life (/stats and /metrics read them)."""

    steps: int = 0  # verify forwards
    drafted: int = 0
    accepted: int = 0


@dataclass
class SpecState:
    """One row's drafter and its back-off."""

    drafter: NgramDrafter | ModelDrafter
    k: int
    skip: int = 0  # pipelined steps to run before drafting again
    _next_skip: int = field(default=1, repr=False)

    def hit(self) -> None:
        self._next_skip = 1

    def miss(self) -> None:
        self.skip = self._next_skip
        self._next_skip = min(self._next_skip * 2, MAX_SKIP)


class SpecConfig:
    """A model's speculative decoding: `mode` "ngram" or "draft" (with `draft_model`), `k`
    tokens drafted per step; `stats` counts what it did."""

    def __init__(self, mode: str, k: int, draft_model=None, stats: SpecStats | None = None):
        self.mode, self.k, self.draft_model = mode, k, draft_model
        self.stats = stats or SpecStats()

    def state(self) -> SpecState:
        drafter = ModelDrafter(self.draft_model) if self.mode == "draft" else NgramDrafter()
        return SpecState(drafter, self.k)


def speculate(b: DecodeBatch, st: SpecState) -> list[Token] | None:
    """One speculative step of `b`'s lone row; None when there was nothing to draft (the
    caller then runs the plain step, with the pending token already evaluated)."""
    fed, fed_lp = b.pending
    assert fed is not None  # a decoding row always has its next token pending
    mx.eval(fed)
    y = int(cast(int, fed.item()))  # mlx's stub: item() is any scalar; a token id here
    room = b.max_tokens[0] - b.num_tokens[0] - 1  # tokens the row may still emit after y
    want = min(st.k, room)
    drafts = st.drafter.propose(b.tokens[0] + [y], want) if want > 0 else []
    if drafts is None:  # a draft model still reading the row's context: try again next step
        return None
    if not drafts:
        st.miss()
        return None
    row = b.sampling[0]
    k = st.k  # padded to k + 1 positions even near max_tokens: one shape per 256 tokens
    n = k + 1
    inp = [y, *drafts] + [drafts[-1]] * (k - len(drafts))
    views = [BucketView(c) for c in b.prompt_cache]
    logits = b.model(mx.array([inp]), cache=views)[0]
    table = Table.of([row] * n, logits.shape[-1])  # one row, n positions
    logits = penalize(logits, table, None)  # bias only: penalised rows never get here
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    key = row.key
    z = sample(logprobs, table)  # splits a seeded row's key n times: put it right below
    mx.eval(z)
    z_host = cast(list[int], z.tolist())  # mlx's stub: tolist() is list or scalar
    a = 0
    while a < len(drafts) and drafts[a] == z_host[a]:
        a += 1
    if key is not None and not row.greedy:
        row.key = key_after(key, a + 1)
    trim_prompt_cache(b.prompt_cache, k - a)
    st.drafter.accepted(len(b.tokens[0]) + 1 + a)
    assert b.spec is not None  # a row speculates only under the batch's SpecConfig
    stats = b.spec.stats
    stats.steps += 1
    stats.drafted += len(drafts)
    stats.accepted += a
    # A verify costs more than a plain step (it gives up the pipelining, and on a CPU each
    # position costs): one that keeps under half its drafts counts as a miss.
    if a and 2 * a >= len(drafts):
        st.hit()
    else:
        st.miss()
    lps = None
    if row.logprobs:
        assert fed_lp is not None  # the step keeps log-probabilities when a row wants them
        lps = mx.concatenate([fed_lp.astype(logprobs.dtype), logprobs[:a]])
    pending = z[a : a + 1], logprobs[a : a + 1] if row.logprobs else None
    return b.emit_lone([y, *drafts[:a]], lps, pending)


class BucketView:
    """A plain KVCache seen by one forward as its whole allocated buffer (a multiple of 256
    positions, as KVCache grows it) with the unused tail masked out."""

    def __init__(self, cache):
        self.c = cache

    @property
    def offset(self) -> int:
        return self.c.offset

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        self.c.update_and_fetch(keys, values)
        return self.c.keys, self.c.values

    def make_mask(self, n: int, **_kw) -> mx.array:
        """Causal over the positions written so far; the buffer's capacity after this update
        is computed as KVCache.update_and_fetch will grow it."""
        c, off = self.c, self.c.offset
        grow = (n + c.step - 1) // c.step * c.step
        if c.keys is None:
            cap = grow
        elif off + n > c.keys.shape[2]:
            # KVCache cuts the buffer at the offset before growing it, unless the offset is a
            # whole number of steps: then the old buffer stays whole (an extracted row's
            # buffer can be longer than its offset and not a multiple of the step).
            cap = (off if off % c.step else c.keys.shape[2]) + grow
        else:
            cap = c.keys.shape[2]
        return mx.arange(cap)[None] <= mx.arange(off, off + n)[:, None]
