"""Sampling for the whole batch in one pass: per-row parameters as arrays, not per-row calls.

Each row's resolved parameters become a RowSampling; the rows of a decode batch become one
Table (arrays of temperatures, filters, biases and penalties, rebuilt only when the batch
changes). `penalize` applies logit bias and the repetition, presence and frequency penalties
to every row at once; `sample` draws every row's token at once (Gumbel-max: argmax of the
scaled log-probabilities plus Gumbel noise, which is a draw from their softmax).

A seeded row draws its noise from its own key, split once per token, so the same seed gives
the same text whatever else shares the batch. A RowSampling is also callable on one row
(`(1, vocab)` log-probabilities): mlx-lm's prompt batch samples each row's first token that
way, through the same code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.sample_utils import greedy_sampler

from mlxd.shared.params import MAX_PENALTY_WINDOW, GenerationParams

# Penalties look at this many of the row's most recent tokens (prompt included) unless the
# request says otherwise, as mlx-lm's processors do by default.
PENALTY_WINDOW = 20


class RowSampling:
    """One row's sampling parameters, and its PRNG key when the request is seeded."""

    def __init__(self, params: GenerationParams):
        self.temperature = params.temperature or 0.0
        self.top_p = params.top_p if params.top_p is not None and 0 < params.top_p < 1 else 1.0
        self.top_k = params.top_k or 0
        self.min_p = params.min_p or 0.0
        self.seed = params.seed
        self.key = mx.random.key(params.seed) if params.seed is not None else None
        # The key before its last split: a preempted row's next token, already drawn, is
        # drawn again when it resumes, from this key (sched/preempt.py).
        self.prev_key = self.key
        self.bias = dict(params.logit_bias or {})
        rp = params.repetition_penalty
        self.repetition = rp if rp is not None and rp > 0 else 1.0
        self.presence = params.presence_penalty or 0.0
        self.frequency = params.frequency_penalty or 0.0
        w = params.penalty_window
        self.window = PENALTY_WINDOW if w is None else min(max(w, 0), MAX_PENALTY_WINDOW)
        if self.window == 0:  # penalties that look at nothing change nothing
            self.repetition, self.presence, self.frequency = 1.0, 0.0, 0.0
        self.logprobs = params.logprobs  # the decode batch keeps log-probabilities for it
        self.speculate = params.speculative is not False  # the model's setting decides the rest

    def rewind(self, sent: int) -> None:
        """A seeded row's key as it was when its `sent` tokens had been drawn (one split a
        token): after a failed step the pipelined decode may have split it once or twice
        more for tokens never sent (engine/recovery.py)."""
        if self.seed is not None:
            self.key = self.prev_key = key_after(mx.random.key(self.seed), sent)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def filters(self) -> bool:
        return not self.greedy and (self.top_p < 1 or self.top_k > 0 or self.min_p > 0)

    @property
    def penalties(self) -> bool:
        return self.repetition != 1.0 or self.presence != 0 or self.frequency != 0

    @property
    def processes(self) -> bool:
        """Whether its logits change before sampling (bias or penalties)."""
        return bool(self.bias) or self.penalties

    def __call__(self, logprobs: mx.array) -> mx.array:
        """The first token (mlx-lm's prompt batch calls this, guarded): parameters the API
        would have refused fail here, for this row only, before the batch sees them."""
        vocab = logprobs.shape[-1]
        if not 0 <= self.top_k < vocab or self.temperature < 0 or not 0 <= self.min_p <= 1:
            raise ValueError(f"sampling parameters out of range for a {vocab}-token vocabulary")
        return sample(logprobs, Table.of([self], vocab))

    def process(self, tokens: mx.array, logits: mx.array) -> mx.array:
        """mlx-lm's logits-processor signature, for the first token (tokens: the context)."""
        window = tokens.reshape(1, -1)[:, -self.window :].astype(mx.int32)
        return penalize(logits, Table.of([self]), window)


@dataclass
class Table:
    """The batch's sampling parameters as arrays (row i is the batch's row i)."""

    rows: list[RowSampling]
    logprobs: bool  # some row wants its log-probabilities
    greedy_all: bool
    any_greedy: bool
    greedy: mx.array | None  # (B,) bool
    inv_temp: mx.array | None  # (B, 1); 1 for greedy rows
    filters: bool
    top_p: mx.array | None  # (B, 1); 2 for rows without (nothing is dropped)
    top_k: mx.array | None  # (B, 1) int: the sorted position of the k-th largest, 0 without
    log_min_p: mx.array | None  # (B, 1); -inf without
    seeded: list[int]
    bias_idx: mx.array | None  # (B, K) token ids; padded with (0, 0.0)
    bias_val: mx.array | None
    width: int  # the penalty window the batch keeps: the widest row's
    window_len: mx.array | None  # (B, 1) each row's own window, when rows differ
    repetition: mx.array | None  # (B, 1), None when no row has it
    presence: mx.array | None
    frequency: mx.array | None

    @property
    def penalties(self) -> bool:
        return any(x is not None for x in (self.repetition, self.presence, self.frequency))

    @classmethod
    def of(cls, rows: list[RowSampling], vocab: int | None = None) -> Table:
        def col(values, dtype=mx.float32):
            return mx.array(values, dtype=dtype).reshape(-1, 1)

        greedy = [r.greedy for r in rows]
        penalised = [r for r in rows if r.penalties]
        width = max((r.window for r in penalised), default=PENALTY_WINDOW)
        sampled = [r for r in rows if not r.greedy]
        filters = any(r.filters for r in rows)
        v = vocab or 0
        bias_w = max((len(r.bias) for r in rows), default=0)
        bias_idx = bias_val = None
        if bias_w:
            idx = [list(r.bias) + [0] * (bias_w - len(r.bias)) for r in rows]
            val = [list(r.bias.values()) + [0.0] * (bias_w - len(r.bias)) for r in rows]
            bias_idx, bias_val = mx.array(idx, dtype=mx.int32), mx.array(val, dtype=mx.float32)
        return cls(
            rows=rows,
            logprobs=any(r.logprobs for r in rows),
            greedy_all=not sampled,
            any_greedy=any(greedy),
            greedy=mx.array(greedy) if sampled and any(greedy) else None,
            inv_temp=col([1.0 if r.greedy else 1.0 / r.temperature for r in rows])
            if sampled
            else None,
            filters=filters,
            top_p=col([r.top_p if r.top_p < 1 and not r.greedy else 2.0 for r in rows])
            if filters
            else None,
            top_k=col([_kth(r.top_k, v) for r in rows], mx.int32) if filters and v else None,
            log_min_p=col([math.log(r.min_p) if r.min_p > 0 else -math.inf for r in rows])
            if filters
            else None,
            seeded=[i for i, r in enumerate(rows) if r.key is not None and not r.greedy],
            bias_idx=bias_idx,
            bias_val=bias_val,
            width=width,
            window_len=col([r.window for r in rows], mx.int32)
            if any(r.window != width for r in penalised)
            else None,
            repetition=col([r.repetition for r in rows])
            if any(r.repetition != 1.0 for r in rows)
            else None,
            presence=col([r.presence for r in rows]) if any(r.presence for r in rows) else None,
            frequency=col([r.frequency for r in rows]) if any(r.frequency for r in rows) else None,
        )


def _kth(top_k: int, vocab: int) -> int:
    """Position, in ascending sorted order, of the k-th largest value (0: keep everything)."""
    return vocab - top_k if 0 < top_k < vocab else 0


def penalize(logits: mx.array, t: Table, window: mx.array | None) -> mx.array:
    """Logit bias, then repetition, presence and frequency penalties, for every row at once.

    `window` (B, W) holds each row's most recent tokens (prompt included), -1 where a row
    has fewer; its last column is the token being fed, so it is always a real token. Ids
    past the vocabulary (an image's content ids, worker/vision/ids.py) count as padding.
    """
    rows = mx.arange(logits.shape[0]).reshape(-1, 1)
    if t.bias_idx is not None:
        assert t.bias_val is not None  # made together with bias_idx
        logits = logits.at[rows, t.bias_idx].add(t.bias_val.astype(logits.dtype))
    if window is None or not t.penalties:
        return logits
    valid = (window >= 0) & (window < logits.shape[-1])
    if t.window_len is not None:  # rows with shorter windows ignore the older columns
        valid = valid & (mx.arange(window.shape[1]) >= window.shape[1] - t.window_len)
    w = mx.where(valid, window, window[:, -1:])  # padding points at a real token: no-op writes
    if t.repetition is not None:
        sel = mx.take_along_axis(logits, w, axis=-1)
        rp = t.repetition.astype(logits.dtype)
        logits = mx.put_along_axis(logits, w, mx.where(sel < 0, sel * rp, sel / rp), axis=-1)
    if t.presence is not None:
        # Once per distinct token: only a token's first place in the window counts.
        later = mx.triu(mx.ones((w.shape[1], w.shape[1]), dtype=mx.bool_), k=1)
        same = (w[:, :, None] == w[:, None, :]) & later[None] & valid[:, :, None]
        seen_before = same.any(axis=1)
        first = valid & ~seen_before
        logits = logits.at[rows, w].subtract((t.presence * first).astype(logits.dtype))
    if t.frequency is not None:
        logits = logits.at[rows, w].subtract((t.frequency * valid).astype(logits.dtype))
    return logits


def key_after(key: mx.array, n: int) -> mx.array:
    """The key after `n` tokens' splits (`sample` splits once per token)."""
    for _ in range(n):
        key, _sub = mx.random.split(key)
    return key


def sample(logprobs: mx.array, t: Table) -> mx.array:
    """Every row's next token from its log-probabilities (B, vocab); shape (B,)."""
    greedy = mx.argmax(logprobs, axis=-1)
    if t.greedy_all:
        return greedy
    assert t.inv_temp is not None  # set whenever a row samples (not greedy_all)
    x = _filtered(logprobs, t) if t.filters else logprobs
    noise = mx.random.gumbel(x.shape)
    for i in t.seeded:
        row = t.rows[i]
        assert row.key is not None  # `seeded` lists the rows with a key
        row.prev_key = row.key
        row.key, sub = mx.random.split(row.key)
        noise[i : i + 1] = mx.random.gumbel((1, x.shape[-1]), key=sub)
    drawn = mx.argmax(x.astype(mx.float32) * t.inv_temp + noise, axis=-1)
    if t.any_greedy:
        assert t.greedy is not None  # set when sampled and greedy rows mix
        return mx.where(t.greedy, greedy, drawn)
    return drawn


def _filtered(x: mx.array, t: Table) -> mx.array:
    """top-p, top-k and min-p at once: each keeps the top of the distribution, so together
    they keep what is above the highest of their thresholds."""
    assert t.top_p is not None and t.log_min_p is not None  # set whenever `filters` is
    s = mx.sort(x, axis=-1)  # ascending
    probs = mx.exp(s.astype(mx.float32))
    above = mx.cumsum(probs, axis=-1, reverse=True, inclusive=False)
    total = above[..., :1] + probs[..., :1]
    dropped = (above >= t.top_p * total).sum(axis=-1, keepdims=True)
    thr = mx.take_along_axis(s, dropped, axis=-1)
    if t.top_k is None:  # a one-row table built without the vocabulary size
        ks = [_kth(r.top_k, x.shape[-1]) for r in t.rows]
        top_k = mx.array(ks, dtype=mx.int32).reshape(-1, 1)
    else:
        top_k = t.top_k
    thr = mx.maximum(thr, mx.take_along_axis(s, top_k, axis=-1))
    thr = mx.maximum(thr, (x.max(axis=-1, keepdims=True) + t.log_min_p).astype(x.dtype))
    return mx.where(x < thr, mx.array(-mx.inf, x.dtype), x)


def make_row_processors(sampling: RowSampling, extra: list, guard=None) -> list:
    """A row's logits processors as mlx-lm calls them for the first token: its bias and
    penalties (marked `batched`: the decode batch applies them for every row at once), then
    its own (a grammar), which run per row. `guard` wraps the first (its failure is the row's)."""
    own = []
    if sampling.processes:
        first = _Batched(sampling)
        if guard is not None:
            first = guard(first)
            first.batched = True
        own.append(first)
    return own + list(extra)


class _Batched:
    """A row's bias and penalties as one mlx-lm logits processor, marked for the decode batch."""

    batched = True

    def __init__(self, sampling: RowSampling):
        self.sampling = sampling

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        return self.sampling.process(tokens, logits)


GREEDY = RowSampling(GenerationParams(temperature=0.0))  # a row inserted without a sampler


def row_sampling_of(sampler) -> RowSampling:
    """The RowSampling behind a row's sampler (admission passes one, maybe guarded)."""
    s = getattr(sampler, "sampling", sampler)
    if s is None or s is greedy_sampler:  # mlx-lm's default: a row inserted without one
        return GREEDY
    if not isinstance(s, RowSampling):
        raise TypeError(f"rows need a RowSampling sampler, got {type(sampler).__name__}")
    return s


def recent_window(tokens: list[list[int]], w: int) -> mx.array:
    """Each row's last `w` tokens, left-padded with -1."""
    rows = [([-1] * w + t[-w:])[-w:] for t in tokens]
    return mx.array(rows, dtype=mx.int32)
