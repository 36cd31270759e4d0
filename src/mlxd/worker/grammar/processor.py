"""Structured output at the sampler: a GuidedSpec becomes a per-row logits processor.

The grammar engine is outlines-core: a regex (JSON schemas, choices and small grammars are
turned into one) is compiled against the model's vocabulary into a token-level automaton.
Compiles are bounded (worker/grammar/compiler.py: static caps, then a child process under a
time and memory limit) and cached by bytes. Each step the row's processor advances the
automaton by the token just sampled and masks every token that cannot continue a match; once
the match is complete only end-of-sequence remains, so the row stops there. Masks are built
with numpy on the CPU and applied with one `mx.where`, which works the same on Metal, CUDA and
the CPU backend.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import threading
from typing import cast

import mlx.core as mx
import numpy as np
from outlines_core import Guide, Index, Vocabulary

from mlxd.shared.structured_output import GuidedSpec
from mlxd.shared.worker_spec import WorkerSpec
from mlxd.worker.grammar.compiler import CompileFailed, CompileSettings, GrammarCompiler
from mlxd.worker.grammar.limits import GrammarLimits
from mlxd.worker.grammar.vocab_bytes import token_bytes
from mlxd.worker.model.load import LoadedModel

log = logging.getLogger("mlxd.worker.grammar.processor")

# Held only while a model's vocabulary is first gathered (once per model), never over a compile.
_vocab_lock = threading.Lock()


class GuidedUnavailable(Exception):
    """The spec cannot be compiled into a grammar (the caller falls back to an instruction)."""


def warning_header(param: str, why: str, outcome: str) -> str:
    """An RFC 7234 `Warning` value saying what could not be enforced, and what we did."""
    why = " ".join(why.replace('"', "'").split()).encode("ascii", "replace").decode()
    return f'299 mlxd "{param} could not be enforced ({why[:300]}); {outcome}"'


async def row_processors(
    m: LoadedModel, spec: GuidedSpec | None, config: WorkerSpec | None = None
) -> tuple[list, str | None]:
    """Processors for a row of a plain completion, and a Warning if `spec` did not compile."""
    if spec is None:
        return [], None
    try:
        return [GuidedProcessor(*await compile_spec(m, spec, config))], None
    except GuidedUnavailable as exc:
        return [], warning_header(spec.param, str(exc), "the output is not constrained")


def compile_settings(config: WorkerSpec | None) -> CompileSettings:
    """The compile bounds from the worker's settings (the defaults without them)."""
    if config is None:
        return CompileSettings()
    return CompileSettings(
        limits=GrammarLimits(
            max_repeat=config.grammar_max_repeat,
            max_bytes=config.grammar_max_bytes,
            max_positions=config.grammar_max_positions,
        ),
        compile_timeout_s=config.grammar_compile_timeout_s,
        compile_memory_bytes=config.grammar_compile_memory_bytes,
        compile_concurrency=config.grammar_compile_concurrency,
        queue_timeout_s=config.grammar_queue_timeout_s,
        cache_bytes=config.grammar_cache_bytes,
    )


class _Vocab:
    """outlines-core's view of a model's vocabulary, built once per model, and its compiler."""

    def __init__(self, m: LoadedModel, settings: CompileSettings):
        self.eos_ids = sorted(m.eos_ids)
        self.eos = self.eos_ids[0]
        skip = set(self.eos_ids) | set(getattr(m.tokenizer, "all_special_ids", []) or [])
        by_bytes: dict[bytes, list[int]] = {}
        for token_id, raw in token_bytes(m.tokenizer).items():
            if token_id not in skip and raw:
                by_bytes.setdefault(raw, []).append(token_id)
        vocabulary = Vocabulary(self.eos, by_bytes)
        self.size = max(max(max(ids) for ids in by_bytes.values()), *self.eos_ids) + 1
        # The compile children get the vocabulary as bytes: pickled once, sent to each.
        self.compiler = GrammarCompiler(pickle.dumps(vocabulary), settings)


def _vocab(m: LoadedModel, settings: CompileSettings) -> _Vocab:
    with _vocab_lock:
        v: _Vocab | None = getattr(m, "guided_vocab", None)
        if v is None:
            v = _Vocab(m, settings)
            m.guided_vocab = v
        return v


async def compile_spec(
    m: LoadedModel, spec: GuidedSpec, config: WorkerSpec | None = None
) -> tuple[Index, _Vocab]:
    """The automaton for `spec`, compiled in a child or taken from the cache.

    Raises GrammarTooLarge / GrammarTooComplex (400) for constraints over a bound, Unavailable
    (503) when every compile slot stays busy, GuidedUnavailable when the engine cannot express
    the constraint. Cancelling the caller stops the compile once no one else waits for it.
    """
    vocab: _Vocab | None = getattr(m, "guided_vocab", None)
    if vocab is None:
        vocab = await asyncio.to_thread(_vocab, m, compile_settings(config))
    try:
        return await vocab.compiler.compile(spec.kind, spec.value, spec.param), vocab
    except CompileFailed as exc:
        raise GuidedUnavailable(str(exc)) from None


class GuidedProcessor:
    """A per-row logits processor: `fn(tokens, logits) -> logits` on the engine thread.

    `after` (token ids of a reasoning end marker): stay inactive until the row has generated
    them, so a model whose prompt opened a think block reasons freely and answers in form.
    """

    # It follows the row's context by position (`_seen`): a preempted row resumed with the
    # same context advances nothing twice (engine/sched/preempt.py).
    resumable = True

    def __init__(self, index: Index, vocab: _Vocab, after: tuple[int, ...] | None = None):
        self._guide = Guide(index)
        self._vocab = vocab
        self._after = list(after) if after else None
        self._recent: list[int] = []
        self._seen: int | None = None
        self._words = np.zeros((1, (vocab.size + 31) // 32), dtype=np.int32)
        self.failed = False

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        # `tokens` is the row's context: the prompt on the first call, then one more sampled
        # token per step. Only what is new since the last call advances the automaton.
        n = tokens.shape[-1]
        if self._seen is not None and n > self._seen:
            # cast: mlx's stub types tolist() as list or scalar; a 1-D slice gives a list
            new = cast(list[int], tokens.reshape(-1)[self._seen : n].tolist())
            for token in new:
                self._advance(int(token))
        self._seen = n
        if self._after is not None:
            return logits
        return mx.where(self._mask(logits.shape[-1]), logits, mx.array(-mx.inf, logits.dtype))

    def _advance(self, token: int) -> None:
        if self._after is not None:
            self._recent = (self._recent + [token])[-len(self._after) :]
            if self._recent == self._after:
                self._after = None  # reasoning is over: the answer is constrained
            return
        if token in self._vocab.eos_ids or self.failed:
            return
        try:
            self._guide.advance(token, return_tokens=False)
        except ValueError:  # cannot happen while the mask is applied; never break the row
            log.warning("token %d does not continue the grammar; ending the row", token)
            self.failed = True

    def _mask(self, width: int) -> mx.array:
        if self.failed:
            allowed = np.zeros(width, dtype=bool)
            allowed[self._vocab.eos_ids] = True
            return mx.array(allowed)
        self._words.fill(0)
        self._guide.write_mask_into(self._words.ctypes.data, self._words.size, 4)
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")
        allowed = np.zeros(width, dtype=bool)
        n = min(width, bits.size)
        allowed[:n] = bits[:n].astype(bool)
        eos = self._vocab.eos
        if allowed[eos] or not allowed.any():
            allowed[self._vocab.eos_ids] = True  # complete (or stuck): any EOS may end it
        return mx.array(allowed)
