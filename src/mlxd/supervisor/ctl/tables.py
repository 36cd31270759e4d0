"""mlxctl's output: aligned tables, sizes and durations, or the body as JSON (--json)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import orjson

from mlxd.shared.sizes import format_size

ERROR_WIDTH = 60


def out(args, body, text: str) -> None:
    """`body` as indented JSON with --json, else `text` (if any)."""
    if args.json:
        sys.stdout.write(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif text:
        print(text)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; "-" for empty cells."""
    cells = [[str(h) for h in headers]] + [
        ["-" if v in (None, "") else str(v) for v in r] for r in rows
    ]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


size = format_size  # the one printer (shared/sizes.py)


def duration(s: float | None) -> str | None:
    if s is None:
        return None
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s // 60:.0f}m{s % 60:02.0f}s"
    return f"{s // 3600:.0f}h{s % 3600 // 60:02.0f}m"


def _short(text: str | None) -> str | None:
    if not text:
        return None
    return text if len(text) <= ERROR_WIDTH else text[: ERROR_WIDTH - 1] + "…"


def ps_table(rows: list[dict]) -> str:
    headers = (
        "MODEL",
        "STATE",
        "PID",
        "MEMORY",
        "LEASES",
        "QUEUED",
        "IDLE",
        "UNLOAD IN",
        "RESTARTS",
        "ADAPTERS",
        "ERROR",
    )
    out = []
    for m in rows:
        expires = "never" if m["keep_alive_s"] < 0 or m["pinned"] else duration(m["expires_in_s"])
        state = m["state"] + (" (drained)" if m["drained"] else "")
        out.append(
            (
                m["id"],
                state,
                m["pid"],
                size((m.get("memory") or {}).get("total_bytes")),
                m["leases"],
                m["queued"],
                duration(m["idle_s"]),
                expires,
                m["restarts"],
                ", ".join(m.get("adapters") or []) or "-",
                _short(m["last_error"]),
            )
        )
    return table(headers, out)


def memory_text(mem: dict | None) -> str | None:
    """A model's memory on one line: the total the budget counts, then its parts."""
    if not mem:
        return None
    kv = f"KV {size(mem['kv_in_use_bytes'])} in use of {size(mem['kv_reserved_bytes'])} reserved"
    return (
        f"{size(mem['total_bytes'])}{'' if mem['reported'] else ' (estimate)'}:"
        f" weights {size(mem['weights_bytes'])}, prompt cache {size(mem['prompt_cache_bytes'])},"
        f" {kv}"
    )


def models_table(rows: list[dict]) -> str:
    return table(
        ("MODEL", "STATE", "SOURCE", "SIZE", "PATH"),
        [(m["id"], m["state"], m["source"], size(m["weights_bytes"]), m["path"]) for m in rows],
    )


def stats_text(body: dict) -> str:
    sup = body["supervisor"]
    lines = [f"{k}: {size(v) if k.endswith('_bytes') else v}" for k, v in sup.items()]
    rows = []
    for model, reply in sorted(body["workers"].items()):
        st = reply.get("body") or {}
        rows.append(
            (
                model,
                st.get("rows_active"),
                st.get("rows_queued"),
                st.get("prompt_tokens"),
                st.get("generation_tokens"),
                st.get("prompt_tps"),
                st.get("decode_tps"),
                size(st.get("cache_ram_bytes")),
                reply.get("error"),
            )
        )
    headers = (
        "MODEL",
        "ACTIVE",
        "QUEUED",
        "PROMPT TOK",
        "GEN TOK",
        "PROMPT TOK/S",
        "GEN TOK/S",
        "RAM CACHE",
        "ERROR",
    )
    return "\n".join(lines) + ("\n\n" + table(headers, rows) if rows else "")


def flush_text(body: dict) -> str:
    parts = [
        f"{name}: {', '.join(body[name])}"
        for name in ("flushed", "unsupported", "failed")
        if body[name]
    ]
    return "\n".join(parts) if parts else "no loaded models"


def action_text(body: dict) -> str:
    m = body["model"]
    line = f"{body['id']}: {body['result']} in {body['elapsed_s']:.1f}s (state {m['state']}"
    line += f", pid {m['pid']})" if m["pid"] else ")"
    drain = body.get("drain")
    if drain and drain.get("in_flight") is not None:
        line += f"; drained {drain['in_flight']} in-flight, cancelled {drain.get('cancelled', 0)}"
    return line


SHOWN_CHARS = 60  # a system prompt or template text is cut to this on one line


def _value(v: object) -> str:
    if isinstance(v, dict):
        return " ".join(f"{k}={x}" for k, x in v.items()) or "-"
    if isinstance(v, list):
        return ", ".join(str(x) for x in v) or "-"
    return "-" if v is None else str(v)


def _setting(v: object) -> str:
    """A setting on one line: text (a system prompt, a template) cut short."""
    if not isinstance(v, str):
        return _value(v)
    text = " ".join(v.split())
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def show_text(body: dict) -> str:
    """`mlxctl show`: one `key  value` line each, then the settings and the folder's defaults."""
    state = body["state"] + (" (drained)" if body["drained"] else "")
    if body["pid"]:
        state += f", pid {body['pid']}"
    arch = body.get("architecture") or {}
    head = [
        ("model", body["id"]),
        ("state", state),
        ("source", body["source"]),
        ("path", body["path"]),
        ("size", size(body["weights_bytes"])),
        ("memory", memory_text(body.get("memory"))),
        ("type", arch.get("model_type")),
        ("context", arch.get("context_length")),
        ("quantized", arch.get("quantization")),
        ("error", body["last_error"]),
    ]
    lines = [f"{k:<10} {_value(v)}" for k, v in head if v not in (None, "", {})]
    for title, section in (
        ("settings", body.get("settings") or {}),
        ("generation_config.json", body.get("generation_config") or {}),
        ("request defaults", body.get("sampling_defaults") or {}),
    ):
        if section:
            lines += ["", title] + [
                f"  {k:<22} {size(v) if k.endswith('_bytes') else _setting(v)}"
                for k, v in section.items()
            ]
    return "\n".join(lines)
