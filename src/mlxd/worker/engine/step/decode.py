"""The decode half of the batch: our own step over mlx-lm's model and batch caches.

mlx-lm's BatchGenerator prefills rows (its PromptProcessingBatch) and hands each one, with its
first token sampled, to its generation batch. We put a DecodeBatch in that place (generator.py),
with the interface the BatchGenerator uses (uids, tokens, prompt_cache, extend, filter,
extract_cache, next), so every later token is ours:

- one sampling pass for the batch (sampling.py) instead of a call per row, with bias and
  penalties as batched array ops; a row's own processors (a grammar) still run per row;
- log-probabilities kept as one array, sliced only for rows that asked for them;
- step t+1 is built and launched (`mx.async_eval`) before step t's tokens are read, so the
  caller's per-token work (detokenizing, stop strings, hand-off) overlaps the device's;
- a lone row decodes on plain caches (mlx-lm's KVCache: no batch mask, no per-row offsets),
  converted on the way in and back when a second row joins, and may speculate
  (speculate.py: drafts from draft.py, checked in one forward);
- the model's forward is compiled once per shape where the caches allow (compiled.py).
Each row's token comes back as a token.Token; `clock` (token.Clock) sums where time goes.
"""

from __future__ import annotations

import time
from typing import cast

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, TokenBuffer

from mlxd.worker.engine.step.compiled import CompiledStep, for_model
from mlxd.worker.engine.step.logprobs import join_rows
from mlxd.worker.engine.step.sampling import (
    RowSampling,
    Table,
    penalize,
    recent_window,
    row_sampling_of,
    sample,
)
from mlxd.worker.engine.step.speculate import SpecConfig, SpecState, speculate
from mlxd.worker.engine.step.token import Clock, Token
from mlxd.worker.kv.layers import plain_only
from mlxd.worker.kv.quant import BatchQuantizedKVCache, head
from mlxd.worker.model import mlx_lm_seam as seam

# Batch caches a lone row can leave for mlx-lm's plain cache and come back to (extract/merge).
LoneType = type[BatchKVCache] | type[BatchQuantizedKVCache]
LONE_TYPES: tuple[LoneType, ...] = (BatchKVCache, BatchQuantizedKVCache)


class DecodeBatch:
    """Rows decoding together: their caches, tokens, sampling and stop state."""

    def __init__(self, model, spec: SpecConfig | None = None, compiled: bool = False):
        self.model = model
        self.compiled: CompiledStep | None = for_model(model) if compiled else None
        self.spec = spec
        self.specs: list[SpecState | None] = []  # each row's drafter, when it may speculate
        self._lone = False  # one row, on plain caches (prompt_cache holds mlx-lm KVCaches)
        self._float = False  # ... and they are float KVCaches (speculate.py's verify needs it)
        self._batch_types: list[LoneType] = []  # the batch cache classes to go back to
        self._surplus = 0  # tokens in the lone cache not yet in tokens[0] (speculate.py)
        self.uids: list[int] = []
        self.prompt_cache: list = []
        self.tokens: list[list[int]] = []  # every token in each row's cache
        self.sampling: list[RowSampling] = []
        self.extras: list[list] = []  # a row's own processors (a grammar): run per row
        self.contexts: list[TokenBuffer | None] = []  # the token context those processors read
        self.max_tokens: list[int] = []
        self.num_tokens: list[int] = []
        self.matchers: list = []
        self.clock: Clock | None = None
        self._next: mx.array | None = None  # the tokens being computed (B,), fed next step
        self._next_lp: mx.array | None = None  # their log-probabilities, when some row wants them
        self._window: mx.array | None = None  # (B, PENALTY_WINDOW) recent tokens, for penalties
        self._table: Table | None = None  # rebuilt after the rows change
        self._adapted = False  # some row of this step has a LoRA adapter
        self.arrived: list[tuple[list[int], mx.array, list]] = []  # rows taken in since next()

    def __len__(self) -> int:
        return len(self.uids)

    def extend(self, other) -> None:
        """Take over rows from mlx-lm's GenerationBatch (their first token already sampled):
        the only batch the BatchGenerator hands over."""
        if not other.uids:
            return
        self._leave_lone()
        n_old = len(self.uids)
        self.uids.extend(other.uids)
        if self.prompt_cache:
            for mine, theirs in zip(self.prompt_cache, other.prompt_cache):
                mine.extend(theirs)
        else:
            self.prompt_cache = other.prompt_cache
        self.tokens.extend(other.tokens)
        self.max_tokens.extend(other.max_tokens)
        new = [row_sampling_of(s) for s in other.samplers]
        handed = seam.handed_rows(other)
        pairs = zip(new, other.logits_processors, handed.token_context, strict=True)
        for s, procs, ctx in pairs:
            self.sampling.append(s)
            extra = [p for p in procs or () if not getattr(p, "batched", False)]
            self.extras.append(extra)
            self.contexts.append(ctx if extra else None)
            may = s.speculate and not extra and not s.penalties
            self.specs.append(self.spec.state() if self.spec is not None and may else None)
        self.num_tokens.extend(handed.num_tokens)
        self.matchers.extend(handed.matchers)
        nxt = handed.next_tokens
        self.arrived.append((list(other.uids), nxt, handed.next_logprobs))  # first_tokens
        lp = None
        if handed.next_logprobs and any(s.logprobs for s in new):
            lp = mx.stack(handed.next_logprobs).reshape(len(other.uids), -1)
        self._next = nxt if self._next is None or n_old == 0 else mx.concatenate([self._next, nxt])
        self._next_lp = join_rows(self._next_lp, n_old, lp, len(other.uids))
        if self._window is not None:
            width = self._window.shape[1]
            self._window = mx.concatenate([self._window, recent_window(other.tokens, width)])
        self._table = None
        self._enter_lone()

    def filter(self, keep: list[int]) -> None:
        """Keep only the rows at positions `keep`."""
        for i in set(range(len(self.uids))) - set(keep):
            if (st := self.specs[i]) is not None:
                st.drafter.release()
        if not keep:
            self.prompt_cache = []
            self._lone = False
        elif not self._lone:
            for c in self.prompt_cache:
                c.filter(keep)
        for name in (
            "uids",
            "tokens",
            "sampling",
            "extras",
            "contexts",
            "max_tokens",
            "num_tokens",
            "matchers",
            "specs",
        ):
            values = getattr(self, name)
            setattr(self, name, [values[i] for i in keep])
        if keep:
            idx = mx.array(keep)
            self._next = self._next[idx] if self._next is not None else None
            self._next_lp = self._next_lp[idx] if self._next_lp is not None else None
            self._window = self._window[idx] if self._window is not None else None
        else:
            self._next = self._next_lp = self._window = None
        self._table = None
        self._enter_lone()

    def extract_cache(self, idx: int) -> list:
        if self._lone:  # a copy of what the row's tokens cover (a view: the row may go on)
            n = self.prompt_cache[0].offset - self._surplus
            return [head(c, n) for c in self.prompt_cache]
        return [c.extract(idx) for c in self.prompt_cache]

    def _enter_lone(self) -> None:
        """A single row moves to plain caches (when every layer's cache can come back)."""
        if self._lone or len(self.uids) != 1:
            return
        if not self.prompt_cache or not all(type(c) in LONE_TYPES for c in self.prompt_cache):
            return
        self._batch_types = [type(c) for c in self.prompt_cache]
        self.prompt_cache = [c.extract(0) for c in self.prompt_cache]
        self._lone = True
        self._float = plain_only(self.prompt_cache)

    def _leave_lone(self) -> None:
        if self._lone:
            pairs = zip(self._batch_types, self.prompt_cache, strict=True)
            self.prompt_cache = [kind.merge([c]) for kind, c in pairs]
            self._lone = False

    # -- the step -------------------------------------------------------------------------
    def next(self) -> list[Token]:
        """Feed the tokens computed last step, launch the next step, return the fed tokens."""
        self.arrived = []
        if not self.uids:
            return []
        # Each row's adapter (worker/lora/) for every forward below, speculation's too.
        self._adapted = seam.forward_rows(self.model, self.uids)
        st = self.specs[0] if self._lone and self._float else None
        if st is not None:
            if st.skip:
                st.skip -= 1
            elif (out := speculate(self, st)) is not None:
                return out
        clock = self.clock
        t0 = time.perf_counter()
        fed, fed_lp = self._next, self._next_lp
        assert fed is not None  # rows came in through extend(), which set their next tokens
        self._launch(fed)
        t1 = time.perf_counter()
        mx.eval(fed)  # waits for the step before, not for the one just launched
        t2 = time.perf_counter()
        tokens = cast(list[int], fed.tolist())  # mlx's stub: tolist() is list or scalar
        out = self._responses(tokens, fed_lp)
        if clock is not None:
            clock["build"] += t1 - t0
            clock["wait"] += t2 - t1
            clock["rows"] += time.perf_counter() - t2
            clock.steps += 1
        return out

    def _launch(self, fed: mx.array) -> None:
        """Build step t+1 on the fed tokens and start it on the device."""
        logits = self._forward(fed)
        if self._table is None:
            self._table = Table.of(self.sampling, logits.shape[-1])
        t = self._table
        if t.penalties:
            if self._window is None or self._window.shape[1] != t.width:
                # The first penalised row, or a wider window: every row's recent tokens.
                self._window = recent_window(self.tokens, t.width)
            self._window = mx.concatenate(
                [self._window[:, 1:], fed[:, None].astype(mx.int32)], axis=1
            )
        logits = penalize(logits, t, self._window)
        for i, extra in enumerate(self.extras):
            if extra:
                ctx = self.contexts[i]
                assert ctx is not None  # kept for every row with its own processors
                context = ctx.update_and_fetch(fed[i : i + 1])
                row = logits[i : i + 1]
                for processor in extra:
                    row = processor(context, row)
                logits[i : i + 1] = row
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        self._next = sample(logprobs, t)
        self._next_lp = logprobs if t.logprobs else None
        outputs = [self._next]
        if self._next_lp is not None:
            outputs.append(self._next_lp)
        if self._window is not None:
            outputs.append(self._window)
        mx.async_eval(*outputs)

    def _forward(self, fed: mx.array) -> mx.array:
        """The step's (rows, vocab) logits: compiled when the caches allow, else plain."""
        c = self.compiled
        # A trace holds the forward it saw: rows with adapters take the plain one.
        if c is not None and not self._adapted and c.usable(self.prompt_cache):
            logits = c(fed, self.prompt_cache)
            if logits is not None:
                return logits
        return self.model(fed[:, None], cache=self.prompt_cache)[:, -1, :]

    @property
    def pending(self) -> tuple[mx.array | None, mx.array | None]:
        """The tokens being computed (fed to the next step) and their log-probabilities."""
        return self._next, self._next_lp

    def emit_lone(
        self, tokens: list[int], lp: mx.array | None, pending: tuple[mx.array, mx.array | None]
    ) -> list[Token]:
        """The lone row's tokens from a speculative step, in order, up to where it ends
        (its cache already holds them all; `_surplus` keeps a hand-off to what it emitted);
        `pending`: the token sampled after them, and its log-probabilities, fed next step."""
        self._next, self._next_lp = pending
        out = []
        uid = self.uids[0]
        for j, tok in enumerate(tokens):
            self._surplus = len(tokens) - j - 1
            self.tokens[0].append(tok)
            self.num_tokens[0] += 1
            finish = "length" if self.num_tokens[0] >= self.max_tokens[0] else None
            if self.matchers[0].advance(tok):
                finish = "stop"
            if finish is None:
                out.append(Token(uid, tok, None, None, None, lp, j))
                continue
            cache = self.extract_cache(0)
            out.append(Token(uid, tok, finish, cache, self.tokens[0], lp, j))
            self.filter([])
            break
        self._surplus = 0
        return out

    def _responses(self, tokens: list[int], lp: mx.array | None) -> list[Token]:
        keep, out = [], []
        for i, (uid, tok) in enumerate(zip(self.uids, tokens)):
            self.tokens[i].append(tok)
            self.num_tokens[i] += 1
            finish = "length" if self.num_tokens[i] >= self.max_tokens[i] else None
            if self.matchers[i].advance(tok):
                finish = "stop"
            if finish is None:
                keep.append(i)
                out.append(Token(uid, tok, None, None, None, lp, i))
            else:
                cache = self.extract_cache(i)
                out.append(Token(uid, tok, finish, cache, self.tokens[i], lp, i))
        if len(keep) < len(self.uids):
            self.filter(keep)
        return out
