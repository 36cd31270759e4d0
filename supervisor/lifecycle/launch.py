"""How a worker is launched: the command line the supervisor gives `python -m mlxd.worker`."""

from __future__ import annotations

from mlxd.shared.config import GRAMMAR_SETTINGS, STREAM_SETTINGS, Settings
from mlxd.supervisor.lifecycle.slot import ModelSlot


def worker_argv(settings: Settings, slot: ModelSlot) -> list[str]:
    """The worker's command line for `slot` (python -m mlxd.worker ...)."""
    s, ms = settings, slot.settings
    argv = [
        "--model-path",
        str(slot.entry.path),
        "--model-id",
        slot.id,
        "--socket",
        str(slot.socket),
        "--batch",
        str(ms.batch or s.batch),
        "--prefill-step",
        str(s.prefill_step),
        "--max-body-bytes",
        str(s.max_body_bytes),
        "--grace-s",
        str(s.drain_timeout_s),
        "--generation",
        str(slot.generation),
    ]
    limit = ms.context_limit or s.context_limit
    if limit:
        argv += ["--context-limit", str(limit)]
    if s.prompt_cache_bytes is not None:
        argv += ["--prompt-cache-bytes", str(s.prompt_cache_bytes)]
    if s.ssd_cache:
        argv += [
            "--ssd-cache-dir",
            str(s.cache_dir),
            "--ssd-cache-bytes",
            str(s.ssd_cache_bytes),
        ]
    else:
        argv += ["--no-ssd-cache"]
    if ms.enable_thinking is not None:
        argv += ["--enable-thinking" if ms.enable_thinking else "--no-enable-thinking"]
    for name in GRAMMAR_SETTINGS + STREAM_SETTINGS:
        argv += ["--" + name.replace("_", "-"), str(getattr(s, name))]
    return argv
