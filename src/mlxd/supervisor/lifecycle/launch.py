"""How a worker is launched: where its socket and log live, its WorkerSpec, its command line."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from mlxd.shared.config import Settings
from mlxd.shared.worker_spec import MODEL_DEFAULT_FIELDS, SAME_AS_SETTINGS, GroupSpec, WorkerSpec

if TYPE_CHECKING:  # slot.py names its socket with socket_path() below
    from mlxd.supervisor.lifecycle.slot import ModelSlot

# UNIX socket paths are limited to about 104 bytes; longer ones are named by a digest.
MAX_SOCKET_PATH = 100


def socket_path(run_dir: Path, model_id: str, generation: int = 0) -> Path:
    """The socket of `model_id`'s worker; a hot reload's generation n gets its own."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in model_id)
    gen = f".g{generation}" if generation else ""
    path = run_dir / f"{safe}{gen}.sock"
    if len(str(path)) > MAX_SOCKET_PATH:
        digest = hashlib.sha1(model_id.encode()).hexdigest()[:12]
        path = run_dir / f"w-{digest}{gen}.sock"
    return path


def log_path(logs_dir: Path, socket: Path) -> Path:
    """The log file of the worker serving `socket` (named after the socket)."""
    return logs_dir / f"{socket.stem}.log"


def worker_spec(
    settings: Settings, slot: ModelSlot, memory_limit_bytes: int | None = None
) -> WorkerSpec:
    """Everything `slot`'s worker needs; `slot.settings` is already resolved (for_model).

    `memory_limit_bytes`: the worker's share of the budget (scheduling.admission.share_bytes)."""
    s, ms = settings, slot.settings
    return WorkerSpec(
        model_path=slot.entry.path,
        model_id=slot.id,
        socket=slot.socket,
        generation=slot.generation,
        batch=ms.batch,
        context_limit=ms.context_limit,
        kv_bits=ms.kv_bits,
        kv_group_size=ms.kv_group_size,
        enable_thinking=ms.enable_thinking,
        model_type=ms.type,
        grace_s=s.drain_timeout_s,
        ssd_cache_dir=s.cache_dir if s.ssd_cache else None,
        memory_limit_bytes=memory_limit_bytes,
        speculative=ms.speculative,
        draft_model=ms.draft_model,
        num_draft_tokens=ms.num_draft_tokens,
        adapters=ms.adapters,
        **(
            {}
            if ms.adapter_cache_bytes is None
            else {"adapter_cache_bytes": ms.adapter_cache_bytes}
        ),
        # A worker group's rank 0; lifecycle/group.py makes the other ranks' specs from it.
        group=(
            GroupSpec(size=ms.ranks, backend=ms.backend, hosts=tuple(ms.hosts))
            if ms.ranks > 1
            else None
        ),
        **{name: getattr(s, name) for name in SAME_AS_SETTINGS},
        **{name: getattr(ms, name) for name in MODEL_DEFAULT_FIELDS},
    )


def worker_argv(
    settings: Settings, slot: ModelSlot, memory_limit_bytes: int | None = None
) -> list[str]:
    """The worker's command line for `slot` (after `python -m mlxd.worker`)."""
    return worker_spec(settings, slot, memory_limit_bytes).to_argv()
