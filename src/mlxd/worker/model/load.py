"""Load a model folder with mlx-lm (no network) and gather what the worker needs to know."""

from __future__ import annotations

import logging
import sys
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
import psutil
from mlx.utils import tree_flatten
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from mlxd.shared.config import is_template_text
from mlxd.shared.kv_math import KvCost
from mlxd.shared.sampling import SamplingDefaults, resolve_defaults
from mlxd.shared.worker_spec import MODEL_DEFAULT_FIELDS, WorkerSpec
from mlxd.worker.dist.shard import shard_model
from mlxd.worker.kv.cost import row_cost
from mlxd.worker.kv.layers import plain_only
from mlxd.worker.kv.scheme import KvScheme, apply_kv_scheme
from mlxd.worker.model import blocks, shape_buckets
from mlxd.worker.model import mlx_lm_seam as seam
from mlxd.worker.model.attention import causal_when_unpadded, route_on_cuda

log = logging.getLogger("mlxd.worker.model.load")

# Used when the vocabulary cannot be read: longer than any piece of the tokenizers we know.
FALLBACK_TOKEN_BYTES = 1024


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    config: dict
    model_id: str
    path: Path
    context_limit: int
    defaults: SamplingDefaults
    kv: KvScheme = KvScheme()  # how its KV is held (kv_bits; kvquant.py)
    # What a row's caches hold (kv/cost.py: measured at load; None: no KV to plan)
    kv_cost: KvCost | None = None
    # grammar/processor.py's vocabulary, built on a first structured-output request (typed
    # object: this room sits below grammar/ and cannot name its class)
    guided_vocab: object | None = field(default=None, repr=False, compare=False)

    @property
    def eos_ids(self) -> list[int]:
        return sorted(self.tokenizer.eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return int(self.config.get("vocab_size") or len(self.tokenizer))

    @cached_property
    def max_token_bytes(self) -> int:
        """An upper bound on the UTF-8 bytes of text one token can stand for.

        The longest vocabulary string, added tokens included, measured in UTF-8: byte-level
        BPE writes each byte as one character (1 or 2 UTF-8 bytes), SentencePiece writes a
        space as the 3-byte "▁" and a fallback byte as "<0xNN>", so a piece's string is never
        shorter than the text it matches.
        """
        try:
            return max(1, max(len(piece.encode()) for piece in self.tokenizer.get_vocab()))
        except Exception:  # an unusual tokenizer: a bound that is still far from unbounded
            log.warning(
                "cannot read the vocabulary; assuming %d bytes per token at most",
                FALLBACK_TOKEN_BYTES,
            )
            return FALLBACK_TOKEN_BYTES

    @cached_property
    def weights_bytes(self) -> int:
        """Bytes the model's parameters hold (quantized weights at their packed size)."""
        return sum(v.nbytes for _, v in _parameters(self.model))

    @property
    def kv_bytes_per_token(self) -> int | None:
        """Full-attention K and V bytes one token of a row adds, in its KV scheme (windows
        and recurrent states: kv_cost)."""
        return None if self.kv_cost is None else self.kv_cost.per_token

    @cached_property
    def kv_dtype_bytes(self) -> int:
        """Bytes of the float dtype K and V (or their scales) are computed in."""
        return _float_bytes(self.model)


def _parameters(model) -> list[tuple[str, Any]]:
    """(name, array) of every parameter. tree_flatten returns this list without a
    `destination`; its annotation also allows the dict it fills when given one."""
    return cast(list[tuple[str, Any]], tree_flatten(model.parameters()))


def _float_bytes(model) -> int:
    """Bytes of the model's floating-point dtype (the KV's): the most common among its
    parameters (a quantized model's scales and norms carry it)."""
    kinds = Counter(v.dtype for _, v in _parameters(model) if mx.issubdtype(v.dtype, mx.floating))
    return kinds.most_common(1)[0][0].size if kinds else 2


def device_memory_bytes() -> int:
    """Memory the default device may use: the GPU's (Metal's recommended working set, CUDA's
    total), else the machine's RAM."""
    info: dict[str, str | int] = {}
    if mx.default_device() != mx.cpu:
        try:
            info = mx.device_info()
        except Exception:  # an older MLX: fall back to RAM
            info = {}
    for key in ("max_recommended_working_set_size", "total_memory", "memory_size"):
        value = info.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return psutil.virtual_memory().total


# MLX keeps freed buffers for reuse, by default up to the device's whole memory. Several
# processes on one device (workers of other models, another MLX server) each holding a cache
# that large run the device out of memory (an 8B model's 16k-token prefill did, on an H200
# shared with mlx_lm.server). Decode reuses a few buffer sizes; a bounded cache keeps them.
BUFFER_CACHE_FRACTION = 16


def limit_buffer_cache() -> int:
    """Cap MLX's buffer cache at 1/16 of the device's memory; returns the cap in bytes."""
    cap = device_memory_bytes() // BUFFER_CACHE_FRACTION
    mx.set_cache_limit(cap)
    return cap


def apply_memory_limit(limit_bytes: int) -> None:
    """MLX's memory limit: past it, an evaluation waits for freed buffers before it allocates
    more (and fails only when even that is not enough), so a worker stays within its plan."""
    mx.set_memory_limit(limit_bytes)


def apply_wired_limit(limit_bytes: int) -> None:
    """On Metal, keep at most `limit_bytes` (never past the recommended working set) wired.

    mlx-lm's BatchGenerator wires the whole recommended working set when it is made and puts
    the previous limit back when closed; the engine calls this after making one."""
    if mx.default_device() == mx.cpu or not mx.metal.is_available():
        return
    try:
        rec = int(mx.device_info()["max_recommended_working_set_size"])
        mx.set_wired_limit(min(limit_bytes, rec))
    except Exception:  # an MLX without wired limits: nothing to bound
        log.debug("no wired limit on this MLX", exc_info=True)


def upcast_on_the_cpu(model) -> None:
    """On MLX's CPU backend, compute in float32: it has no fast float16/bfloat16 kernels (a
    4-bit matmul with float16 scales runs ~100x slower than with float32)."""
    if mx.default_device() != mx.cpu:
        return
    if any(v.dtype in (mx.float16, mx.bfloat16) for _, v in _parameters(model)):
        model.set_dtype(mx.float32)
        mx.eval(model.parameters())  # here: lazy arrays belong to this thread's stream


def held_arrays(model: nn.Module) -> list:
    """Every array a model holds: its parameters, private module entries (mlx-lm's Llama 3,
    YaRN and proportional RoPE tables as `_freqs`) and arrays on plain objects (Pixtral's
    rotary table). Those outside the parameters stay lazy after a load, and a lazy array
    made on the loading thread cannot be evaluated on another thread's stream (MLX 0.32:
    "There is no Stream(cpu, 0) in current thread"), so loads evaluate them all where they
    were made."""
    kept = mx.array | nn.Module | dict | list  # arrays, and what may hold them
    every = model.filter_and_map(lambda _m, _k, v: isinstance(v, kept))
    out: list = [pair[1] for pair in tree_flatten(every)]
    for module in model.modules():
        for value in vars(module).values():
            if not isinstance(value, nn.Module | mx.array) and hasattr(value, "__dict__"):
                out += [v for v in vars(value).values() if isinstance(v, mx.array)]
    return out


def context_of(native: int, context_limit: int | None) -> int:
    """The context a worker serves: the model's own, or the configured limit below it."""
    return min(context_limit, native) if context_limit else native


def load_for_spec(spec: WorkerSpec, group: Any = None) -> LoadedModel:
    """The chat model a WorkerSpec names, with its config defaults and KV scheme (rank 0 and a
    worker group's followers load the same way; `group`: this rank's mx.distributed group)."""
    loaded = load_model(
        spec.model_path,
        spec.model_id,
        spec.context_limit,
        overrides={name: getattr(spec, name) for name in MODEL_DEFAULT_FIELDS},
        kv_bits=spec.kv_bits,
        kv_group_size=spec.kv_group_size,
        group=group,
    )
    use_blocks(choose_block(loaded.model, spec.prefill_block))
    shape_buckets.set_on(spec.attention_buckets)  # read only where attention is routed (CUDA)
    return loaded


def choose_block(model, setting: int | None) -> int:
    """The prefill block (blocks.py) for `model`: the setting's (None: off until the H200
    measures it against the padding it costs); off for a model whose caches are not all
    plain KV, and where MLX has no CUDA (Metal and the CPU build no graphs: padding would
    only cost)."""
    cuda = sys.platform.startswith("linux") and mx.default_device() == mx.gpu
    wanted = setting or 0
    if wanted and not cuda and not blocks.ANY_DEVICE:
        log.info("prefill_block off: only CUDA builds a kernel graph per attention shape")
        return 0
    if wanted and not plain_only(make_prompt_cache(model)):
        log.info("prefill_block off: this model's caches are not all plain KV")
        return 0
    return wanted


def use_blocks(tokens: int) -> None:
    """Prefill in whole blocks of `tokens` from now on in this process (0: off)."""
    blocks.set_block(tokens)
    if tokens:
        seam.patch_prompt_blocks()
        log.info("prefill in blocks of %d tokens (few attention shapes; blocks.py)", tokens)


def load_model(
    path: Path,
    model_id: str,
    context_limit: int | None = None,
    upcast_on_cpu: bool = True,
    overrides: dict[str, Any] | None = None,
    kv_bits: int | None = None,
    kv_group_size: int = 64,
    group: Any = None,
) -> LoadedModel:
    """Load `path`; raises on any problem with the folder (the caller maps it to an exit code).

    `overrides` are the config section's defaults (WorkerSpec MODEL_DEFAULT_FIELDS): the set
    ones win over the folder's generation_config.json and chat template. `kv_bits` quantizes
    the model's KV (a model whose caches cannot be quantized raises ValueError). With a worker
    `group` (an mx.distributed.Group), only this rank's shard is loaded (worker/group/)."""
    route_on_cuda(device_memory_bytes())  # small prefills: no cuDNN graph build (attention.py)
    causal_when_unpadded()  # fused causal kernels for unpadded prompt batches (attention.py)
    seam.patch_prompt_split()  # rows leaving prefill together: their KV is not copied
    # return_config=True gives the 3-tuple; mlx-lm annotates load() as either shape
    model, tokenizer, config = load(  # type: ignore[misc]
        str(path), return_config=True, lazy=group is not None
    )
    if group is not None:
        shard_model(model, config, group)
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    if "chat_template" in overrides:
        _set_chat_template(tokenizer, overrides.pop("chat_template"))
    if upcast_on_cpu:
        upcast_on_the_cpu(model)
    mx.eval(held_arrays(model))  # here, on the loading thread (the engine's is another)
    kv = apply_kv_scheme(model, kv_bits, kv_group_size)
    limit = context_of(int(config.get("max_position_embeddings") or 0) or 32768, context_limit)
    loaded = LoadedModel(
        model=model,
        tokenizer=tokenizer,
        config=config,
        model_id=model_id,
        path=path,
        context_limit=limit,
        defaults=resolve_defaults(path, overrides),
        kv=kv,
    )
    _ = loaded.max_token_bytes  # read the vocabulary now, not on the first request
    # Measured here, once: /stats reads it from the event loop's thread.
    loaded.kv_cost = row_cost(model, config, loaded.kv_dtype_bytes, kv.bits, kv.group_size)
    return loaded


def _set_chat_template(tokenizer, template: str) -> None:
    """Render with `template` (Jinja text, or a file holding it) instead of the folder's."""
    text = template if is_template_text(template) else Path(template).read_text()
    seam.set_chat_template(tokenizer, text)
