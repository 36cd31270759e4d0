"""The worker's settings, from its command line (the supervisor builds that command line)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from mlxd.shared.config import GRAMMAR_SETTINGS


@dataclass(frozen=True)
class WorkerConfig:
    model_path: Path
    model_id: str
    socket: Path
    batch: int = 8
    context_limit: int | None = None
    prefill_step: int = 512
    max_body_bytes: int = 32 * 1024 * 1024
    grace_s: float = 30.0
    exit_with_parent: bool = True
    enable_thinking: bool | None = None  # None: the chat template's own default
    prompt_cache_bytes: int | None = None  # None: sized from memory; 0: no prompt cache
    ssd_cache_dir: Path | None = None  # None: no SSD tier
    ssd_cache_bytes: int = 20 * 1024**3
    cache_quiet_s: float = 2.0
    cache_idle_s: float = 300.0
    generation: int = 0  # the supervisor's slot generation; /health reports it back
    stream_heartbeat_s: float = 10.0  # a quiet stream's protocol event interval (sse.Heartbeat)
    debug_prefill_delay_s: float = 0.0  # test-only: hold the first token back this long
    # Structured-output grammars (docs/security.md): static caps, then the compile's bounds.
    grammar_max_repeat: int = 1000
    grammar_max_bytes: int = 64 * 1024
    grammar_max_positions: int = 50_000
    grammar_compile_timeout_s: float = 30.0
    grammar_compile_memory_bytes: int = 2 * 1024**3
    grammar_compile_concurrency: int = 2
    grammar_queue_timeout_s: float = 10.0
    grammar_cache_bytes: int = 256 * 1024**2


def parse_args(argv: list[str] | None = None) -> WorkerConfig:
    p = argparse.ArgumentParser(
        prog="python -m mlxd.worker", description="Serve one MLX model over a UNIX socket."
    )
    p.add_argument("--model-path", type=Path, required=True, help="mlx-lm model folder")
    p.add_argument("--model-id", required=True, help="the name clients use in `model`")
    p.add_argument("--socket", type=Path, required=True, help="UNIX socket path to bind")
    p.add_argument("--batch", type=int, default=8, help="most rows decoded together (8)")
    p.add_argument(
        "--context-limit",
        type=int,
        default=None,
        help="most tokens per row, prompt plus output (default: the model's)",
    )
    p.add_argument(
        "--prefill-step",
        type=int,
        default=512,
        help="prompt tokens per prefill chunk between decode steps (512)",
    )
    p.add_argument("--max-body-bytes", type=int, default=32 * 1024 * 1024)
    p.add_argument(
        "--grace-s",
        type=float,
        default=30.0,
        help="on SIGTERM, how long in-flight rows may run before cancel (30)",
    )
    p.add_argument(
        "--no-exit-with-parent",
        action="store_true",
        help="keep running when the parent process dies",
    )
    p.add_argument(
        "--prompt-cache-bytes",
        type=int,
        default=None,
        help="RAM prompt cache cap in bytes (default: 1/8 of RAM, at most 16 GiB;"
        " 0 disables the prompt cache)",
    )
    p.add_argument(
        "--ssd-cache-dir",
        type=Path,
        default=Path("~/.mlxd/cache"),
        help="SSD tier root (default ~/.mlxd/cache)",
    )
    p.add_argument("--no-ssd-cache", action="store_true", help="RAM tier only")
    p.add_argument(
        "--ssd-cache-bytes",
        type=int,
        default=20 * 1024**3,
        help="SSD tier cap in bytes (default 20 GiB)",
    )
    p.add_argument(
        "--cache-quiet-s",
        type=float,
        default=2.0,
        help="write a settled cache entry to SSD after this many quiet seconds",
    )
    p.add_argument(
        "--cache-idle-s",
        type=float,
        default=300.0,
        help="entries unused this long leave RAM (they stay on SSD)",
    )
    p.add_argument(
        "--enable-thinking",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="default for the template's enable_thinking switch (default: the "
        "template's); a request's chat_template_kwargs still win",
    )
    p.add_argument(
        "--generation",
        type=int,
        default=0,
        help="the supervisor's generation for this worker, echoed by /health (0)",
    )
    p.add_argument(
        "--stream-heartbeat-s",
        type=float,
        default=10.0,
        help="a quiet stream sends a protocol event (not only a comment) this often",
    )
    p.add_argument("--debug-prefill-delay-s", type=float, default=0.0, help=argparse.SUPPRESS)
    _grammar_args(p)
    a = p.parse_args(argv)
    if a.batch < 1:
        p.error("--batch must be at least 1")
    if a.grammar_compile_concurrency < 1:
        p.error("--grammar-compile-concurrency must be at least 1")
    return WorkerConfig(
        model_path=a.model_path,
        model_id=a.model_id,
        socket=a.socket,
        batch=a.batch,
        context_limit=a.context_limit,
        prefill_step=a.prefill_step,
        max_body_bytes=a.max_body_bytes,
        grace_s=a.grace_s,
        exit_with_parent=not a.no_exit_with_parent,
        enable_thinking=a.enable_thinking,
        prompt_cache_bytes=a.prompt_cache_bytes,
        ssd_cache_dir=None if a.no_ssd_cache else a.ssd_cache_dir.expanduser(),
        ssd_cache_bytes=a.ssd_cache_bytes,
        cache_quiet_s=a.cache_quiet_s,
        cache_idle_s=a.cache_idle_s,
        generation=a.generation,
        stream_heartbeat_s=a.stream_heartbeat_s,
        debug_prefill_delay_s=a.debug_prefill_delay_s,
        **{f: getattr(a, f) for f in _GRAMMAR_FIELDS},
    )


_GRAMMAR_FIELDS = GRAMMAR_SETTINGS  # the supervisor passes each as a flag of the same name


def _grammar_args(p: argparse.ArgumentParser) -> None:
    d = WorkerConfig.__dataclass_fields__
    helps = {
        "grammar_max_repeat": "largest repetition count in a constraint ({m,n}, maxLength, …)",
        "grammar_max_bytes": "largest regex, grammar or schema, in bytes",
        "grammar_max_positions": "largest regex once its counted repetitions are expanded",
        "grammar_compile_timeout_s": "a grammar compile longer than this is a 400",
        "grammar_compile_memory_bytes": "memory one grammar compile may use, else a 400",
        "grammar_compile_concurrency": "grammar compiles at once; more wait, then 503",
        "grammar_queue_timeout_s": "how long a compile waits for a free slot before a 503",
        "grammar_cache_bytes": "compiled-grammar cache cap in bytes (LRU)",
    }
    for name in _GRAMMAR_FIELDS:
        default = d[name].default
        p.add_argument(
            "--" + name.replace("_", "-"),
            type=type(default),
            default=default,
            help=f"{helps[name]} ({default})",
        )
