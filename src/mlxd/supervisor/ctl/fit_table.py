"""`mlxctl fit`'s human output: the plan's numbers, one row per KV scheme, the worker now."""

from __future__ import annotations

from mlxd.supervisor.ctl.tables import memory_text, size, table


def _bits(n: int | None) -> str:
    if n is None:
        return "?"
    return "float" if n == 16 else f"{n}-bit"


def _layers(b: dict) -> str:
    """The layers and what their caches hold, e.g. "4 layers (2 attention x 2 KV heads x 32
    head dim, 2 sliding-window, 2 recurrent)"."""
    heads = f"{b['kv_heads']} KV heads x {b['head_dim']} head dim"
    full, window, state = (
        b.get(k, 0) for k in ("attention_layers", "window_layers", "state_layers")
    )
    if not (window or state):
        return f"{b['layers']} layers x {heads}"
    parts = [f"{full} attention x {heads}"]
    if window:
        parts.append(f"{window} sliding-window")
    if state:
        parts.append(f"{state} recurrent")
    return f"{b['layers']} layers ({', '.join(parts)})"


def _scheme_rows(b: dict) -> tuple[list[str], list[tuple]]:
    """The schemes table; window and state columns only for models that have them."""
    schemes = b["schemes"]
    window = any(s.get("window") for s in schemes)
    state = any(s.get("state_bytes_per_row") for s in schemes)
    headers = ["KV", "BYTES/TOKEN"]
    headers += ["WINDOW BYTES/TOKEN"] if window else []
    headers += ["STATE/ROW"] if state else []
    headers += ["CONTEXT AT BATCH 1", "BATCH AT CONTEXT"]
    rows = []
    for s in schemes:
        name = _bits(s["kv_bits"]) + (" *" if s["kv_bits"] == b["kv_bits"] else "")
        row: list = [name + (" (measured)" if s.get("measured") else ""), s["bytes_per_token"]]
        if window:
            row.append(f"{s['windowed_bytes_per_token']} (up to {s['window']})")
        if state:
            row.append(size(s["state_bytes_per_row"]))
        rows.append((*row, s["max_context_at_batch_1"], s["max_batch_at_context"]))
    return headers, rows


def fit_text(body: dict) -> str:
    """GET /admin/fit's body as lines a person reads."""
    b = body
    lines = [
        f"{b['model']}: {_layers(b)}, context {b['context_length']}, batch {b['batch']}, KV"
        f" {_bits(b['kv_bits'])} (group {b['kv_group_size']}, {b['kv_dtype_bytes']}-byte floats)",
        f"plan: budget {size(b['budget_bytes'])} (machine {size(b['machine_memory_bytes'])})"
        f" - weights {size(b['weights_bytes'])} - prompt cache {size(b['prompt_cache_bytes'])}"
        f" - headroom {size(b['headroom_bytes'])} = KV {size(b['kv_budget_bytes'])}",
        "",
        table(*_scheme_rows(b)),
    ]
    loaded = b.get("loaded")
    if loaded:
        lines += [
            "",
            f"now: {loaded['state']}, holds {memory_text(loaded['memory'])}",
            f"KV {_bits(loaded.get('kv_bits'))}: budget"
            f" {size(loaded.get('kv_budget_bytes')) or '-'}; budget free for it"
            f" {size(b['free_bytes'])}",
        ]
    else:
        lines += ["", f"now: not loaded; budget free for it {size(b['free_bytes'])}"]
    return "\n".join(lines)
