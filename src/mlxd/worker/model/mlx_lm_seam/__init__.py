"""The one package that names mlx-lm's private attributes or patches it (mlx-lm 0.32).

mlx-lm's BatchGenerator prefills; its decode half is ours (engine/step/decode.py), put in its
place here (core.py); the prompt batch, where rows prefill and leave for decoding, is patched
in prompts.py. Every private name either module reads or writes is listed in SEAM, and
tests/integration/test_mlx_lm_seam.py checks each on the pinned mlx-lm: an upgrade that renames
one fails that test, and at run time `require` raises instead of an assignment silently making a
new attribute (mlx-lm's own path would then run instead of ours, and nothing would say so).
Callers import the package (`from mlxd.worker.model import mlx_lm_seam as seam`).
"""

from __future__ import annotations

from mlx_lm.generate import BatchGenerator, GenerationBatch, PromptProcessingBatch
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxd.worker.model.mlx_lm_seam.core import (
    ORIGINAL_MAKE_MASK,
    ORIGINAL_SDPA,
    HandedRows,
    SeamError,
    advance_write_index,
    decode_batch_of,
    handed_rows,
    new_generator,
    patch_make_mask,
    patch_sdpa,
    require,
    restore_make_mask,
    sdpa,
    set_chat_template,
    set_prefill_chunk,
    swap_embedding,
    write_index,
)
from mlxd.worker.model.mlx_lm_seam.prompts import (
    _ROW_HOOKS,
    ORIGINAL_GEN_STEP,
    ORIGINAL_PROMPT,
    ORIGINAL_SPLIT,
    RowHook,
    fold_last_token,
    folding,
    forward_rows,
    hand_over_prompted,
    patch_prompt_blocks,
    patch_prompt_split,
    restore_prompt_split,
    set_row_hook,
)

# (class, private attribute) pairs the seam reads or writes; the seam test pins each.
SEAM: tuple[tuple[type, str], ...] = (
    (BatchGenerator, "_generation_batch"),
    (BatchGenerator, "_prompt_batch"),
    (BatchGenerator, "_currently_processing"),
    (BatchGenerator, "_unprocessed_sequences"),
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

__all__ = [
    "SEAM",
    "BatchGenerator",
    "HandedRows",
    "ORIGINAL_GEN_STEP",
    "ORIGINAL_MAKE_MASK",
    "ORIGINAL_PROMPT",
    "ORIGINAL_SDPA",
    "ORIGINAL_SPLIT",
    "RowHook",
    "SeamError",
    "_ROW_HOOKS",
    "advance_write_index",
    "decode_batch_of",
    "fold_last_token",
    "folding",
    "forward_rows",
    "hand_over_prompted",
    "handed_rows",
    "new_generator",
    "patch_make_mask",
    "patch_prompt_blocks",
    "patch_prompt_split",
    "patch_sdpa",
    "require",
    "restore_make_mask",
    "restore_prompt_split",
    "sdpa",
    "set_chat_template",
    "set_prefill_chunk",
    "set_row_hook",
    "swap_embedding",
    "write_index",
]
