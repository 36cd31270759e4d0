"""The one module that names mlx-lm's private attributes or patches it (mlx-lm 0.32).

mlx-lm's BatchGenerator prefills; its decode half is ours (decode.py), put in its place here.
Every private name we read or write is listed in SEAM, and tests/integration/test_mlx_lm_seam.py
checks each on the pinned mlx-lm: an upgrade that renames one fails that test, and at run time
`_require` raises instead of an assignment silently making a new attribute (mlx-lm's own path
would then run instead of ours, and nothing would say so).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx.utils import tree_unflatten
from mlx_lm.generate import BatchGenerator, GenerationBatch, PromptProcessingBatch
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxd.worker.model import blocks

# (class, private attribute) pairs this module reads or writes; the seam test pins each.
SEAM: tuple[tuple[type, str], ...] = (
    (BatchGenerator, "_generation_batch"),
    (BatchGenerator, "_prompt_batch"),
    (BatchGenerator, "_currently_processing"),
    (PromptProcessingBatch, "prefill_step_size"),
    (GenerationBatch, "_token_context"),
    (GenerationBatch, "_num_tokens"),
    (GenerationBatch, "_matchers"),
    (GenerationBatch, "_next_tokens"),
    (GenerationBatch, "_next_logprobs"),
    (GenerationBatch, "_step"),
    (BatchKVCache, "_idx"),
    (TokenizerWrapper, "_tokenizer"),
    (TokenizerWrapper, "_chat_template"),
)


class SeamError(RuntimeError):
    """mlx-lm no longer has an attribute mlxd relies on: the seam needs updating."""


def _require(obj: Any, name: str) -> None:
    if not hasattr(obj, name):
        raise SeamError(
            f"mlx-lm's {type(obj).__name__} has no {name!r}: mlxd's engine/mlx_lm_seam.py "
            "needs updating for this mlx-lm version"
        )


# -- the generator: mlx-lm prefills, we decode ---------------------------------------------
def new_generator(model, *, batch: int, chunk: int, stream, decode_batch) -> BatchGenerator:
    """mlx-lm's BatchGenerator of `batch` rows prefilling in `chunk`s, decoding through
    `decode_batch` (which offers the interface BatchGenerator calls on its generation batch)."""
    gen = BatchGenerator(
        model,
        completion_batch_size=batch,
        prefill_batch_size=batch,
        prefill_step_size=chunk,
        stream=stream,
    )
    _require(gen, "_generation_batch")
    gen._generation_batch = decode_batch
    return gen


def decode_batch_of(gen: BatchGenerator):
    """The decode batch `new_generator` installed."""
    return gen._generation_batch


def set_prefill_chunk(gen: BatchGenerator, chunk: int) -> None:
    """The prompt tokens each prefilling row gets per step, and the forward size inside
    mlx-lm's prompt batch (which copies the generator's value only when it is made)."""
    gen.prefill_step_size = chunk
    _require(gen, "_prompt_batch")
    prompt_batch = gen._prompt_batch
    _require(prompt_batch, "prefill_step_size")
    prompt_batch.prefill_step_size = chunk


@dataclass
class HandedRows:
    """What mlx-lm's GenerationBatch hands our decode batch: rows whose first token is
    sampled (`next_tokens`, `next_logprobs`) with their stop and processor state."""

    token_context: list
    num_tokens: list[int]
    matchers: list
    next_tokens: mx.array
    next_logprobs: list


def handed_rows(batch) -> HandedRows:
    """The private half of a GenerationBatch mlx-lm hands over (its public half, uids,
    tokens, samplers, ..., is read directly)."""
    for name in ("_token_context", "_num_tokens", "_matchers", "_next_tokens", "_next_logprobs"):
        _require(batch, name)
    return HandedRows(
        batch._token_context,
        batch._num_tokens,
        batch._matchers,
        batch._next_tokens,
        batch._next_logprobs,
    )


# -- mlx-lm's batch KV cache -----------------------------------------------------------------
def write_index(cache: BatchKVCache) -> int:
    """Where a BatchKVCache writes its next position (every row: left-padded)."""
    return cache._idx


def advance_write_index(cache: BatchKVCache, n: int = 1) -> None:
    """Move a BatchKVCache's write position after writing `n` positions in place."""
    _require(cache, "_idx")
    cache._idx += n


ORIGINAL_MAKE_MASK = BatchKVCache.make_mask


def patch_make_mask(fn) -> None:
    """BatchKVCache.make_mask, for the whole process (attention.causal_when_unpadded)."""
    BatchKVCache.make_mask = fn  # type: ignore[method-assign]


def restore_make_mask() -> None:
    """mlx-lm's own make_mask again (tests, benchmarks)."""
    BatchKVCache.make_mask = ORIGINAL_MAKE_MASK  # type: ignore[method-assign]


def hand_over_prompted(gen: BatchGenerator) -> list:
    """Rows whose prompt this step finished (all but its last token prefilled) go to the
    decode batch now, their first token sampled, instead of at the start of the next step.

    mlx-lm's step hands rows over before it prefills, so a row whose prefill ends in a step
    waits a whole step (another chunk of everyone's prefill, another decode) before its first
    token is even computed, and a third before it is read: this takes one of those steps
    away. Called right after `gen.next()`, on its stream. Returns the rows' prompt responses
    (end of prompt), as mlx-lm's step would have reported them next time. Only for trimmable
    caches: a non-trimmable row's snapshot at its prompt's boundary is taken from the prompt
    batch after the step (Batch.snapshot), before the last token enters its cache."""
    _require(gen, "_currently_processing")
    rows = gen._currently_processing  # [segments left, prefilled, total] per prompt row
    done = [i for i, (segments, _, _) in enumerate(rows) if [len(s) for s in segments] == [1]]
    if not done:
        return []
    last = [rows[i][0][0] for i in done]
    totals = [rows[i][2] for i in done]
    gone = set(done)
    with mx.stream(gen.stream):
        gen._currently_processing = [r for i, r in enumerate(rows) if i not in gone]
        moved = gen._prompt_batch.split(done).generate(last)
        gen._generation_batch.extend(moved)
    return [
        PromptProcessingBatch.Response(uid, (n, n), True, True)
        for uid, n in zip(moved.uids, totals, strict=True)
    ]


# -- mlx-lm's prompt batch: rows leaving prefill -------------------------------------------
ORIGINAL_SPLIT = PromptProcessingBatch.split

# The fields PromptProcessingBatch keeps one entry per row in (its split and filter move them).
_PER_ROW = (
    "uids",
    "prompt_cache",
    "tokens",
    "samplers",
    "logits_processors",
    "max_tokens",
    "stop_sequences",
)


def _split_handing_over(self, indices):
    """PromptProcessingBatch.split, but when every row leaves (the usual case: rows admitted
    together finish their prefill in one step) the batch's KV is handed over as it is. mlx-lm
    deep-copies the whole prompt batch's KV and then filters both halves: a copy of every
    row's history (on the H200, 8 rows of 6-8k tokens of the 8B shape: 90 ms of a 0.7 s first
    token; docs/benchmarks.md)."""
    if sorted(indices) != list(range(len(self.uids))):
        return ORIGINAL_SPLIT(self, indices)
    moved = copy.copy(self)  # shares the per-row lists; this batch gets new empty ones
    for name in _PER_ROW:
        _require(self, name)
        setattr(self, name, [])
    return moved


def patch_prompt_split() -> None:
    """Rows leaving prefill together keep their KV without a copy (above). Idempotent."""
    PromptProcessingBatch.split = _split_handing_over  # type: ignore[method-assign]


def restore_prompt_split() -> None:
    """mlx-lm's own split again (tests, benchmarks)."""
    PromptProcessingBatch.split = ORIGINAL_SPLIT  # type: ignore[method-assign]


# -- each row's adapter and images, before every forward mlx-lm runs (worker/lora/, vision/) --
# A hook gets the forward's rows (uids, in the batch's order) and, for a prefill forward, each
# row's chunk as (offset in its prompt, length); None for a decode step.
RowHook = Callable[[list[int], list[tuple[int, int]] | None], bool]
_ROW_HOOKS: dict[int, dict[str, RowHook]] = {}  # id(model) -> the model's hooks by name
ORIGINAL_PROMPT = PromptProcessingBatch.prompt
ORIGINAL_GEN_STEP = GenerationBatch._step


def forward_rows(model, uids: list[int], chunk: list[tuple[int, int]] | None = None) -> bool:
    """Tell `model`'s hooks which rows (by uid, in the batch's order) the next forward runs,
    and for a prefill where each row's chunk starts and how long it is: what its LoRA layers
    and its image embedding read. True when any row has an adapter."""
    adapted = False
    for hook in list(_ROW_HOOKS.get(id(model), {}).values()):
        adapted = hook(uids, chunk) or adapted
    return adapted


def _prompt_with_rows(self, tokens):
    # self.tokens: each row's tokens already in its cache (its prefix), so its length is
    # where this chunk starts in the row's prompt.
    chunk = [(len(done), len(t)) for done, t in zip(self.tokens, tokens, strict=True)]
    forward_rows(self.model, self.uids, chunk)
    if blocks.block > 0 and tokens:
        return _prompt_in_blocks(self, tokens)
    return ORIGINAL_PROMPT(self, tokens)


def _prompt_in_blocks(self, tokens: list[list[int]]) -> None:
    """PromptProcessingBatch.prompt with the forward's width rounded up to whole blocks
    (blocks.py): the same steps as mlx-lm's (record the tokens, right-pad, prefill in
    `prefill_step_size` pieces, roll the padding to the left), only wider padding."""
    if len(self.uids) != len(tokens):
        raise ValueError("The batch length doesn't match the number of inputs")
    for done, new in zip(self.tokens, tokens, strict=True):
        done += new
    lengths = [len(t) for t in tokens]
    width = blocks.round_up(max(lengths))
    padding = [width - n for n in lengths]
    ids = mx.array([t + [0] * p for t, p in zip(tokens, padding, strict=True)])
    if max(padding) > 0:
        for c in self.prompt_cache:
            c.prepare(lengths=lengths, right_padding=padding)
    while ids.shape[1] > 0:
        n = min(self.prefill_step_size, ids.shape[1])
        self.model(ids[:, :n], cache=self.prompt_cache)
        mx.eval([c.state for c in self.prompt_cache])
        mx.clear_cache()
        ids = ids[:, n:]
    if max(padding) > 0:
        for c in self.prompt_cache:
            c.finalize()
        mx.eval([c.state for c in self.prompt_cache])
        mx.clear_cache()


def _step_with_rows(self):
    forward_rows(self.model, self.uids)
    return ORIGINAL_GEN_STEP(self)


def patch_prompt_blocks() -> None:
    """Prefill forwards whole blocks wide while `blocks.block` is set (above). Idempotent."""
    PromptProcessingBatch.prompt = _prompt_with_rows  # type: ignore[method-assign]


def set_row_hook(model, hook: RowHook, name: str = "lora") -> None:
    """Call `hook` with the rows of every forward of `model` mlx-lm's prompt batch (every
    prefill chunk, with each row's chunk) and generation batch (a row's first token) run.
    One hook per `name`; idempotent."""
    _require(GenerationBatch, "_step")
    _ROW_HOOKS.setdefault(id(model), {})[name] = hook
    PromptProcessingBatch.prompt = _prompt_with_rows  # type: ignore[method-assign]
    GenerationBatch._step = _step_with_rows  # type: ignore[method-assign]


def swap_embedding(model, wrap: Callable[[Any], Any]) -> Any:
    """Put `wrap(embedding)` in place of the text model's token embedding (the module named
    `embed_tokens`, wherever the family nests it) and return the wrapper. The wrapper keeps
    the original's `as_linear`, which tied output heads call."""
    named = [(k, m) for k, m in model.named_modules() if k.split(".")[-1] == "embed_tokens"]
    if len(named) != 1:
        raise SeamError(f"expected one embed_tokens module, found {[k for k, _ in named]}")
    key, inner = named[0]
    wrapper = wrap(inner)
    model.update_modules(tree_unflatten([(key, wrapper)]))
    return wrapper


# -- MLX's attention kernel, for the whole process -------------------------------------------
ORIGINAL_SDPA = mx.fast.scaled_dot_product_attention


def sdpa():
    """The attention every mlx-lm model calls now."""
    return mx.fast.scaled_dot_product_attention


def patch_sdpa(fn) -> None:
    """Route every model's attention call through `fn` (mlx-lm looks the kernel up per call)."""
    mx.fast.scaled_dot_product_attention = fn


# -- the tokenizer's chat template -------------------------------------------------------------
def set_chat_template(tokenizer: TokenizerWrapper, text: str) -> None:
    """Render with `text` (Jinja) instead of the folder's template: on the wrapped
    tokenizer, and with mlx-lm's own renderer (which some models have, and would win) off."""
    for name in ("_tokenizer", "_chat_template"):
        _require(tokenizer, name)
    tokenizer._tokenizer.chat_template = text
    tokenizer._chat_template = None
    tokenizer.has_chat_template = True
