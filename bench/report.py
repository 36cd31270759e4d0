"""Turn Figures into the results: medians, ratios against the yardstick, a markdown table,
and a JSON file with every sample (so a later reader can recompute anything)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from .context import Figure

BASE_LABELS = {
    "mlx_lm": "mlx_lm.server",
    "worker": "worker socket",
    "bare_load": "fresh mlx_lm.load",
    "mlxd_ram": "mlxd RAM hit",
    "mlxd_cold": "mlxd cold re-prefill",
    "mlxd_resend": "mlxd resend from RAM",
    "mlxd_base": "mlxd, all on the base",
    "mlx_vlm": "mlx-vlm generate",
    "mlxd_turn1": "mlxd turn 1 (cold)",
}


def summarize(fig: Figure) -> dict:
    """Medians per target, the subject / base ratio, and whether the goal is met."""
    medians = {t: statistics.median(v) for t, v in fig.samples.items() if v}
    subj, base = medians.get(fig.subject), medians.get(fig.base)
    ratio = subj / base if subj is not None and base else None
    pairs = [
        a / b for a, b in zip(fig.samples.get(fig.subject, []), fig.samples.get(fig.base, [])) if b
    ]
    if fig.paired and pairs:
        ratio = statistics.median(pairs)
    met = None
    if ratio is not None and fig.goal is not None:
        met = ratio >= fig.goal if fig.higher_is_better else ratio <= fig.goal
    # Half the min-max range over the median, worst of the two targets: how far apart runs
    # were, to read a ratio against (a 5% gap means little when runs differ by 30%).
    spread = max(
        (
            ((max(v) - min(v)) / 2 / medians[t])
            for t, v in fig.samples.items()
            if t in (fig.subject, fig.base) and v and medians[t]
        ),
        default=None,
    )
    if fig.paired and pairs:  # the pair ratios' own spread: what the ratio is read against
        spread = (max(pairs) - min(pairs)) / 2 / ratio
    return {
        "spread": spread,
        "workload": fig.workload,
        "metric": fig.metric,
        "unit": fig.unit,
        "higher_is_better": fig.higher_is_better,
        "subject": fig.subject,
        "base": fig.base,
        "samples": fig.samples,
        "median": medians,
        "ratio": ratio,
        "paired": fig.paired,
        "goal": fig.goal,
        "goal_met": met,
        "note": fig.note.strip(),
    }


def _value(v: float | None, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit == "B":
        return f"{v / 1e6:.2f} MB" if v >= 1e5 else f"{v:.0f} B"
    if unit == "s":
        return f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s"
    return f"{v:.1f} {unit}"


def _goal(row: dict) -> str:
    if row["goal"] is None:
        return ""
    sign = "≥" if row["higher_is_better"] else "≤"
    mark = {True: " ✓", False: " ✗", None: ""}[row["goal_met"]]
    return f"{sign} {row['goal']:.2f}×{mark}"


def markdown(rows: list[dict], meta: dict) -> str:
    """The table people read: one line per metric, mlxd against its yardstick."""
    out = [
        f"**{meta['date']}** · {meta['machine']} · model: {meta['model']}",
        "",
        f"Versions: {meta['versions']}. mlxd target: {meta['mlxd_target']}. "
        f"Servers: {meta['servers_text']}. Sizes: {meta['sizes_text']}. "
        "Each figure is the median of the runs (all samples are in results.json); run spread "
        "is half the min-max range over the median, the worse of the two servers.",
        "",
        "| Workload | Metric | mlxd | Baseline | Baseline value | mlxd / baseline | Goal "
        "| Run spread |",
        "|---|---|---:|---|---:|---:|---|---:|",
    ]
    for r in rows:
        med = r["median"]
        ratio = f"{r['ratio']:.2f}×" if r["ratio"] is not None else "n/a"
        spread = f"±{r['spread'] * 100:.0f}%" if r["spread"] is not None else ""
        out.append(
            f"| {r['workload']} | {r['metric']} | {_value(med.get(r['subject']), r['unit'])} | "
            f"{BASE_LABELS.get(r['base'], r['base'])} | {_value(med.get(r['base']), r['unit'])} "
            f"| {ratio} | {_goal(r)} | {spread} |"
        )
    notes = [
        f"- {r['workload']} / {r['metric']} vs {BASE_LABELS.get(r['base'], r['base'])}: {r['note']}"
        for r in rows
        if r["note"]
    ]
    notes += [f"- {n}" for n in meta.get("notes", [])]
    if notes:
        out += ["", "Notes:", *notes]
    return "\n".join(out) + "\n"


def write(out_dir: Path, figures: list[Figure], meta: dict) -> tuple[str, list[dict]]:
    """Write results.json and results.md into `out_dir`; return the markdown and rows."""
    rows = [summarize(f) for f in figures]
    md = markdown(rows, meta)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(
        json.dumps({"meta": meta, "figures": rows}, indent=2, ensure_ascii=False) + "\n"
    )
    (out_dir / "results.md").write_text(md)
    return md, rows
