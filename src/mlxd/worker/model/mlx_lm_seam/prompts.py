"""The seam's prompt half: mlx-lm's prompt batch, where rows prefill and leave for decoding.

Rows handed to the decode batch right after the step that finished their prompt; a row's last
prompt token prefilled with the rest, its first token sampled from that forward's logits;
rows leaving together keeping their KV without a copy; every forward's rows told to the row
hooks (LoRA adapters, image features); our prompt (prefill.py) where mlx-lm's will not do.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import BatchGenerator, GenerationBatch, PromptProcessingBatch

from mlxd.worker.model import blocks, prefill
from mlxd.worker.model.mlx_lm_seam.core import SeamError, require


def hand_over_prompted(gen: BatchGenerator) -> list:
    """Rows whose prompt this step finished go to the decode batch now, their first token
    sampled, instead of at the start of the next step.

    mlx-lm's step hands rows over before it prefills, so a row whose prefill ends in a step
    waits a whole step (another chunk of everyone's prefill, another decode) before its first
    token is even computed, and a third before it is read: this takes one of those steps
    away. Called right after `gen.next()`, on its stream, inside `folding` when rows fold
    their last token (their first token then comes from the logits their prefill forward
    left; a row whose last token stayed apart gets it from a forward of that token, as in
    mlx-lm). Returns the rows' prompt responses (end of prompt), as mlx-lm's step would have
    reported them next time. Only for trimmable caches: a non-trimmable row's snapshot at
    its prompt's boundary is taken from the prompt batch after the step (Batch.snapshot),
    before the last token enters its cache."""
    require(gen, "_currently_processing")
    # Folded rows: their whole prompt is in their caches (no segment left).
    folded = _hand_over(gen, lambda segments: not segments, lambda b, _: _sampled_from_prefill(b))
    # Rows whose last token stayed apart: it is their one segment left.
    apart = _hand_over(
        gen,
        lambda segments: [len(s) for s in segments] == [1],
        lambda b, segments: b.generate([s[0] for s in segments]),
    )
    return folded + apart


def _hand_over(
    gen: BatchGenerator,
    ended: Callable[[list], bool],
    start: Callable[[PromptProcessingBatch, list], GenerationBatch],
) -> list:
    """Move the prompt rows whose segments left satisfy `ended` to the decode batch, their
    first token sampled by `start(their prompt batch, their segments left)`."""
    rows = gen._currently_processing  # [segments left, prefilled, total] per prompt row
    done = [i for i, (segments, _, _) in enumerate(rows) if ended(segments)]
    if not done:
        return []
    gone = set(done)
    with mx.stream(gen.stream):
        gen._currently_processing = [r for i, r in enumerate(rows) if i not in gone]
        moved = start(gen._prompt_batch.split(done), [rows[i][0] for i in done])
        gen._generation_batch.extend(moved)
    return [
        PromptProcessingBatch.Response(uid, (rows[i][2],) * 2, True, True)
        for uid, i in zip(moved.uids, done, strict=True)
    ]


# -- a row's first token from its prefill forward (prefill.py, head.py) ----------------------
class _Fold(threading.local):
    """The step `folding` is inside: its generator, the model's head, the logits it left."""

    def __init__(self):
        self.gen: BatchGenerator | None = None
        self.site: Any = None
        self.logits: dict[int, mx.array] = {}


_FOLD = _Fold()


def fold_last_token(gen: BatchGenerator, uid: int) -> None:
    """The row just inserted as `uid` prefills its last prompt token with the rest.

    mlx-lm keeps a prompt's last token apart and samples the first token from a decode
    forward of it alone (a forward of every newcomer over its whole KV: 27-80 ms on the
    H200's 8B shape). Prefilled with the chunk before it, the row's first token comes from
    that chunk's forward instead (`folding`)."""
    require(gen, "_unprocessed_sequences")
    for entry in reversed(gen._unprocessed_sequences):
        if entry[0] == uid:
            segments = entry[1]  # [..., prompt[:-1], [last]] as insert_segments left it
            if len(segments) > 1 and len(segments[-1]) == 1:
                segments[-2:] = [segments[-2] + segments[-1]]
            return
    raise SeamError(f"row {uid} is not waiting in mlx-lm's queue")


@contextmanager
def folding(gen: BatchGenerator, site) -> Iterator[None]:
    """Inside: a prefill forward of `gen` in which rows' prompts end (their last token folded
    in, `fold_last_token`) runs the model's head (`site`, head.py) on each row's last
    position and keeps those rows' logits, which `hand_over_prompted` samples from."""
    PromptProcessingBatch.prompt = _prompt_with_rows  # type: ignore[method-assign]
    _FOLD.gen, _FOLD.site, _FOLD.logits = gen, site, {}
    try:
        yield
    finally:
        _FOLD.gen, _FOLD.site, _FOLD.logits = None, None, {}


def _rows_ending(batch: PromptProcessingBatch) -> list[int]:
    """Positions in `batch` of rows whose prompt ends with the chunk mlx-lm prefills now."""
    gen = _FOLD.gen
    if gen is None or gen._prompt_batch is not batch:
        return []
    rows = gen._currently_processing  # parallel to the prompt batch's rows
    if len(rows) != len(batch.uids):
        raise SeamError("mlx-lm's prompt rows and prompt batch no longer line up")
    return [i for i, (segments, _, _) in enumerate(rows) if not segments]


class _PrefillLogits(nn.Module):
    """Stands in for the model where mlx-lm's GenerationBatch samples a first token: the
    logits are those the rows' prefill forward left (`folding`)."""

    def __init__(self, logits: mx.array):
        super().__init__()
        self.logits = logits

    def __call__(self, inputs: mx.array, cache=None) -> mx.array:
        return self.logits[:, None, :]


def _sampled_from_prefill(batch: PromptProcessingBatch) -> GenerationBatch:
    """mlx-lm's GenerationBatch for rows whose whole prompt is in their caches, their first
    token sampled from their prefill forward's logits by mlx-lm's own sampling code (each
    row's sampler and processors), as its constructor samples them from a forward of the
    last token: that token is in the caches already, so it goes in as the input only."""
    try:
        first = mx.stack([_FOLD.logits.pop(uid) for uid in batch.uids])
    except KeyError as exc:
        raise SeamError(f"row {exc} ended its prompt without first-token logits") from None
    return GenerationBatch(
        model=_PrefillLogits(first),
        uids=batch.uids,
        inputs=mx.array([t[-1] for t in batch.tokens]),
        prompt_cache=batch.prompt_cache,
        tokens=[t[:-1] for t in batch.tokens],  # the constructor's step appends the input
        samplers=batch.samplers,
        fallback_sampler=batch.fallback_sampler,
        logits_processors=batch.logits_processors,
        stop_sequences=batch.stop_sequences,
        max_tokens=batch.max_tokens,
    )


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
        require(self, name)
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
    if not tokens:
        return ORIGINAL_PROMPT(self, tokens)
    ending = _rows_ending(self)
    if ending:
        logits = prefill.prompt(self, tokens, _FOLD.site)
        assert logits is not None
        for i in ending:
            _FOLD.logits[self.uids[i]] = logits[i]
        return None
    if blocks.block > 0:
        return prefill.prompt(self, tokens)
    return ORIGINAL_PROMPT(self, tokens)


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
    require(GenerationBatch, "_step")
    _ROW_HOOKS.setdefault(id(model), {})[name] = hook
    PromptProcessingBatch.prompt = _prompt_with_rows  # type: ignore[method-assign]
    GenerationBatch._step = _step_with_rows  # type: ignore[method-assign]
