"""The seam's core: the private names mlxd relies on, the generator with our decode batch in it,
mlx-lm's batch KV cache, the text model's embedding, MLX's attention kernel and the tokenizer's
chat template (the package's docstring, __init__.py, says what the seam is)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx.utils import tree_unflatten
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxd.worker.model.modules import modules_named


class SeamError(RuntimeError):
    """mlx-lm no longer has an attribute mlxd relies on: the seam needs updating."""


def require(obj: Any, name: str) -> None:
    """Raise SeamError unless `obj` has `name` (an assignment would silently make it)."""
    if not hasattr(obj, name):
        raise SeamError(
            f"mlx-lm's {type(obj).__name__} has no {name!r}: mlxd's worker/model/mlx_lm_seam/ "
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
    require(gen, "_generation_batch")
    gen._generation_batch = decode_batch
    return gen


def decode_batch_of(gen: BatchGenerator):
    """The decode batch `new_generator` installed."""
    return gen._generation_batch


def set_prefill_chunk(gen: BatchGenerator, chunk: int) -> None:
    """The prompt tokens each prefilling row gets per step, and the forward size inside
    mlx-lm's prompt batch (which copies the generator's value only when it is made)."""
    gen.prefill_step_size = chunk
    require(gen, "_prompt_batch")
    prompt_batch = gen._prompt_batch
    require(prompt_batch, "prefill_step_size")
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
        require(batch, name)
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
    require(cache, "_idx")
    cache._idx += n


ORIGINAL_MAKE_MASK = BatchKVCache.make_mask


def patch_make_mask(fn) -> None:
    """BatchKVCache.make_mask, for the whole process (attention.causal_when_unpadded)."""
    BatchKVCache.make_mask = fn  # type: ignore[method-assign]


def restore_make_mask() -> None:
    """mlx-lm's own make_mask again (tests, benchmarks)."""
    BatchKVCache.make_mask = ORIGINAL_MAKE_MASK  # type: ignore[method-assign]


def swap_embedding(model, wrap: Callable[[Any], Any]) -> Any:
    """Put `wrap(embedding)` in place of the text model's token embedding (the module named
    `embed_tokens`, wherever the family nests it) and return the wrapper. The wrapper keeps
    the original's `as_linear`, which tied output heads call."""
    named = modules_named(model, "embed_tokens")
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
        require(tokenizer, name)
    tokenizer._tokenizer.chat_template = text
    tokenizer._chat_template = None
    tokenizer.has_chat_template = True
