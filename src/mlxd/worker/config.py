"""The worker's command line: `--spec JSON` from the supervisor, or the standalone flags.

Both give the same WorkerSpec (shared/worker_spec.py), the one launch contract; the flags'
defaults are the spec's own.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import ValidationError

from mlxd.shared.sizes import size_arg
from mlxd.shared.worker_spec import GRAMMAR_FIELDS, SPEC_FLAG, WorkerSpec

PROG = "python -m mlxd.worker"
DEFAULT_SSD_CACHE_DIR = Path("~/.mlxd/cache")  # standalone only: the supervisor always says


def parse_args(argv: Sequence[str] | None = None, *, log_level: str = "INFO") -> WorkerSpec:
    """The spec in `argv` (default sys.argv[1:]); usage errors exit 2 as argparse does.

    `log_level` is the standalone default (the entry point reads $MLXD_LOG_LEVEL); a --spec
    carries its own."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a == SPEC_FLAG or a.startswith(SPEC_FLAG + "=") for a in args):
        return _from_spec(args)
    return _from_flags(args, log_level)


def _from_spec(args: list[str]) -> WorkerSpec:
    p = argparse.ArgumentParser(prog=PROG, description="Serve one model as the supervisor says.")
    p.add_argument(SPEC_FLAG, required=True, help="a WorkerSpec as JSON (see docs/worker.md)")
    a = p.parse_args(args)
    try:
        return WorkerSpec.model_validate_json(a.spec)
    except ValidationError as exc:
        p.error(f"invalid {SPEC_FLAG}: {exc}")


def _from_flags(args: list[str], log_level: str) -> WorkerSpec:
    p = _flag_parser(log_level)
    a = p.parse_args(args)
    if a.batch < 1:
        p.error("--batch must be at least 1")
    if a.grammar_compile_concurrency < 1:
        p.error("--grammar-compile-concurrency must be at least 1")
    fields = vars(a)
    fields["exit_with_parent"] = not fields.pop("no_exit_with_parent")
    ssd_dir = fields.pop("ssd_cache_dir").expanduser()
    fields["ssd_cache_dir"] = None if fields.pop("no_ssd_cache") else ssd_dir
    try:
        return WorkerSpec(**fields)
    except ValidationError as exc:
        p.error(str(exc))


def _default(name: str):
    return WorkerSpec.model_fields[name].default


def _flag_parser(log_level: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Serve one MLX model over a UNIX socket.",
        epilog=f"The supervisor starts a worker with {SPEC_FLAG} JSON instead (docs/worker.md).",
    )
    p.add_argument("--model-path", type=Path, required=True, help="mlx-lm model folder")
    p.add_argument("--model-id", required=True, help="the name clients use in `model`")
    p.add_argument("--socket", type=Path, required=True, help="UNIX socket path to bind")
    _opt(p, "batch", int, "most rows decoded together")
    p.add_argument(
        "--context-limit",
        type=int,
        default=None,
        help="most tokens per row, prompt plus output (default: the model's)",
    )
    p.add_argument(
        "--prefill-step",
        type=int,
        default=None,
        help="prompt tokens per prefill step while nothing decodes (default: 4096 on a GPU,"
        " 512 on the CPU; a sliding window of 1024+ tokens where it is smaller)",
    )
    _opt(p, "prefill_budget", int, "prompt tokens per step while rows decode")
    _opt(p, "prefill_target_s", float, "a busy step's wall-time target, seconds (0: off)")
    _opt(p, "prefill_block", int, "prefill in whole blocks of this many tokens (0: off)")
    p.add_argument(
        "--attention-buckets",
        action=argparse.BooleanOptionalAction,
        default=_default("attention_buckets"),
        help="on CUDA, rows extending cached prefixes attend in bucketed shapes (default: on)",
    )
    p.add_argument(
        "--compile-decode",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile the decode forward once per shape (default: on the CPU only)",
    )
    p.add_argument(
        "--first-token-from-prefill",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="sample a row's first token from its prefill forward, not a decode forward of"
        " its last prompt token (default: with a GPU)",
    )
    p.add_argument(
        "--kv-budget-bytes",
        type=size_arg,
        default=None,
        help="KV cache bytes the rows in flight may hold; more rows wait (default: from"
        " memory; 0: rows bounded by --batch only)",
    )
    p.add_argument(
        "--kv-bits",
        type=int,
        choices=(4, 8),
        default=None,
        help="quantize the KV cache to this many bits (default: the model's float dtype)",
    )
    p.add_argument(
        "--kv-group-size",
        type=int,
        choices=(32, 64, 128),
        default=_default("kv_group_size"),
        help="KV elements sharing one scale and bias when quantized (64)",
    )
    p.add_argument(
        "--memory-limit-bytes",
        type=size_arg,
        default=None,
        help="memory this worker may use: its weights, prompt cache and KV are planned within"
        " it (default: the device's memory, or the RAM)",
    )
    p.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=_default("warmup"),
        help="run the prefill and decode shapes once before serving (default on)",
    )
    p.add_argument("--max-body-bytes", type=size_arg, default=_default("max_body_bytes"))
    _opt(p, "grace_s", float, "on SIGTERM, how long in-flight rows may run before cancel")
    p.add_argument(
        "--no-exit-with-parent",
        action="store_true",
        help="keep running when the parent process dies",
    )
    p.add_argument(
        "--prompt-cache-bytes",
        type=size_arg,
        default=None,
        help="RAM prompt cache cap in bytes (default: 1/8 of RAM or of a CUDA card, at most 16 GiB;"
        " 0 disables the prompt cache)",
    )
    p.add_argument(
        "--ssd-cache-dir",
        type=Path,
        default=DEFAULT_SSD_CACHE_DIR,
        help=f"SSD tier root (default {DEFAULT_SSD_CACHE_DIR})",
    )
    p.add_argument("--no-ssd-cache", action="store_true", help="RAM tier only")
    p.add_argument(
        "--ssd-cache-bytes",
        type=size_arg,
        default=_default("ssd_cache_bytes"),
        help="SSD tier cap in bytes (default 20 GiB)",
    )
    p.add_argument(
        "--ssd-read-ahead",
        action=argparse.BooleanOptionalAction,
        default=_default("ssd_read_ahead"),
        help="from the start (beside the warm-up), read the newest SSD entries into the RAM "
        "tier's room (default on)",
    )
    _opt(
        p,
        "cache_quiet_s",
        float,
        "write a settled cache entry to SSD after this many quiet seconds",
    )
    _opt(p, "cache_idle_s", float, "entries unused this long leave RAM (they stay on SSD)")
    p.add_argument(
        "--enable-thinking",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="default for the template's enable_thinking switch (default: the "
        "template's); a request's chat_template_kwargs still win",
    )
    p.add_argument(
        "--model-type",
        choices=("chat", "embedding", "transcription"),
        default=None,
        help="serve the folder as this kind of model (default: detected from its files)",
    )
    p.add_argument(
        "--speculative",
        choices=("off", "ngram", "draft"),
        default=_default("speculative"),
        help="speculative decoding of a lone row: prompt lookup or a draft model (off)",
    )
    p.add_argument("--draft-model", type=Path, default=None, help="the draft model's folder")
    _opt(p, "num_draft_tokens", int, "tokens drafted per step")
    _opt(p, "generation", int, "the supervisor's generation for this worker, echoed by /health")
    _opt(
        p,
        "stream_heartbeat_s",
        float,
        "a quiet stream sends a protocol event (not only a comment) this often",
    )
    p.add_argument(
        "--strip-attribution-lines",
        action=argparse.BooleanOptionalAction,
        default=_default("strip_attribution_lines"),
        help="take per-session attribution lines (Claude Code's x-anthropic-billing-header:)"
        " out of system text before rendering, so new sessions share the prompt cache"
        " (default on)",
    )
    p.add_argument(
        "--debug-prefill-delay-s",
        type=float,
        default=_default("debug_prefill_delay_s"),
        help=argparse.SUPPRESS,
    )
    p.add_argument(
        "--step-log", type=Path, help="append one JSON line per engine step to this file"
    )
    p.add_argument(
        "--log-level",
        default=log_level,
        help=f"DEBUG, INFO, WARNING or ERROR (default $MLXD_LOG_LEVEL, else INFO: {log_level})",
    )
    p.add_argument(
        "--image-urls",
        action=argparse.BooleanOptionalAction,
        default=_default("image_urls"),
        help="fetch http(s) image URLs in requests (default off: inline base64 images only)",
    )
    p.add_argument(
        "--image-url-private",
        action=argparse.BooleanOptionalAction,
        default=_default("image_url_private"),
        help="let image URLs reach loopback, private and link-local addresses (default off)",
    )
    _opt(p, "image_max_count", int, "most images in one request")
    _opt(p, "image_max_bytes", size_arg, "largest image, in encoded bytes")
    _opt(p, "image_max_pixels", int, "largest image's width × height, checked before decoding")
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
    for name in GRAMMAR_FIELDS:
        kind = size_arg if name.endswith("_bytes") else type(_default(name))
        _opt(p, name, kind, helps[name])
    return p


def _opt(p: argparse.ArgumentParser, name: str, kind: Callable, help_text: str) -> None:
    """`--name-with-dashes` with the spec's default, shown in its help."""
    default = _default(name)
    p.add_argument(
        "--" + name.replace("_", "-"), type=kind, default=default, help=f"{help_text} ({default})"
    )
