"""`python -m bench adapters`: clients spread over many LoRA adapters on one mlxd worker
(S-LoRA batching, issue 36) against the same clients all on the base model.

    python -m bench adapters --repeats 2 --clients 8 --prompt 64 --tokens 16   # CPU smoke
    python -m bench adapters --shape qwen3-8b                                  # H200

N random adapters are made for the model by mlx-lm's own LoRA layers (tests/lora_adapters.py;
rank --rank on --keys of the last --lora-layers blocks, random non-zero A and B, mlx-lm's
format) and mounted on ONE mlxd through its config.toml (`adapters = {a0 = ..., ...}`). Per
level, --clients streamed chat requests go at the same moment (fresh --prompt token prompts,
greedy, EOS forbidden so every row makes --tokens), row i naming adapter i mod N
(`model: "bench-a:a<k>"`); level 0 is all on the base, the yardstick. Per level: aggregate
tok/s (every completion token over the wall), TTFT p50/p95 and the wall, and each over the
base-only figure of the same run (paired, the issue's target: >= 0.8x at 16 adapters).
mlx_lm.server takes `adapters` (a folder) per request but loads one model key at a time: an
adapter change drains its batch and loads the model again. Its figures (--mlx-lm-levels, 0
and 1 by default) are the reference rows, mlxd against it at the same level.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from . import served
from .client import BenchError, StreamResult, Target, stream_chat
from .context import Context, Figure, _order, _percentile, at_once
from .models import tests_module
from .session import MODEL_A
from .turns import SERVER_FAILED

BASE = "mlxd_base"  # mlxd with every row on the base model, in the same run
SCALE = 20.0  # mlx-lm lora's default scale
KEYS = {"qv": ["self_attn.q_proj", "self_attn.v_proj"], "all": None}  # all: mlx-lm's default


@dataclass(frozen=True)
class AdapterSizes:
    """How big the workload is (the CLI's flags)."""

    levels: tuple[int, ...] = (1, 4, 16)  # adapters the rows are spread over (0: base only)
    clients: int = 32
    prompt: int = 300
    tokens: int = 128
    repeats: int = 3
    rank: int = 8
    lora_layers: int = 16  # mlx-lm lora's default num_layers (the last 16 blocks)
    keys: str = "qv"
    mlx_lm_levels: tuple[int, ...] = (0, 1)


def build_adapters(model_dir: Path, dest: Path, sz: AdapterSizes) -> list[Path]:
    """max(levels) random adapters for `model_dir` (its weights are never read: lazy load)."""
    from mlx_lm.utils import load_model

    lora = tests_module("lora_adapters")
    blocks = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    layers = min(sz.lora_layers, blocks)
    params = lora.lora_params(sz.rank, SCALE, KEYS[sz.keys])
    model = lora.lora_model(load_model(model_dir, lazy=True)[0], layers, params)
    n = max(sz.levels, default=0)
    print(f"building {n} LoRA adapters (rank {sz.rank}, {sz.keys}, {layers} layers) ...")
    return [
        lora.save_random_adapter(model, dest / f"a{i}", layers, params, i + 1) for i in range(n)
    ]


def config_toml(adapters: list[Path]) -> str:
    """The supervisor's config.toml: every adapter mounted on the bench's model."""
    mounts = ", ".join(f"a{i} = {json.dumps(str(p))}" for i, p in enumerate(adapters))
    return f'[models."{MODEL_A}"]\nadapters = {{ {mounts} }}\n' if adapters else ""


def rows(ctx: Context, server: str, level: int, adapters: list[Path], n: int) -> list[Target]:
    """The n rows' targets at `level`: row i on adapter i mod level (level 0: the base)."""
    if server == "mlxd":
        named = [dataclasses.replace(ctx.mlxd, model=f"{MODEL_A}:a{k}") for k in range(level)]
        base = ctx.mlxd
    else:  # mlx_lm.server: a per-request adapter folder, with the model named by its path
        named = [
            dataclasses.replace(ctx.mlx_lm, model=str(ctx.model_a), extra_body={"adapters": str(p)})
            for p in adapters[:level]
        ]
        base = ctx.mlx_lm
    return [named[i % level] for i in range(n)] if level else [base] * n


def level_stats(rs: list[StreamResult], wall: float) -> dict[str, float]:
    """One level's figures from its rows: aggregate tok/s, TTFT p50/p95, wall."""
    ttfts = [r.ttft_s for r in rs]
    return {
        "agg": sum(r.completion_tokens for r in rs) / wall,
        "ttft50": _percentile(ttfts, 0.5),
        "ttft95": _percentile(ttfts, 0.95),
        "wall": wall,
    }


def _label(level: int) -> str:
    return "base only" if level == 0 else f"{level} adapter{'s' if level > 1 else ''}"


def _level_figures(n: int, level: int, vs: str, goal: float | None) -> dict[str, Figure]:
    base, paired = (BASE, True) if vs == "base" else ("mlx_lm", False)
    f = lambda metric, unit, hib, g=None: Figure(  # noqa: E731
        f"adapters ×{n}", f"{metric} @{_label(level)}", unit, hib, base=base, goal=g,
        paired=paired,
    )  # fmt: skip
    return {
        "agg": f("aggregate tok/s", "tok/s", True, goal),
        "ttft50": f("TTFT p50", "s", False),
        "ttft95": f("TTFT p95", "s", False),
        "wall": f("wall", "s", False),
    }


def figures(sz: AdapterSizes, goal: float = 0.8) -> dict[tuple[str, int], dict[str, Figure]]:
    """("base", L): mlxd at L over mlxd base-only (paired by run); ("mlx_lm", L): mlxd over
    mlx_lm.server at L. The issue's goal is on aggregate tok/s at 16 adapters."""
    out = {("base", x): _level_figures(sz.clients, x, "base", goal if x == 16 else None)
           for x in sz.levels if x}  # fmt: skip
    for x in sz.mlx_lm_levels:
        out[("mlx_lm", x)] = _level_figures(sz.clients, x, "mlx_lm", None)
    return out


def add_run(figs, measured: dict[tuple[str, int], dict[str, float]]) -> None:
    """One run's stats per (server, level) into the figures; each vs-base pair together."""
    for (vs, level), fig in figs.items():
        subject = measured.get(("mlxd", level))
        base = measured.get(("mlxd", 0) if vs == "base" else ("mlx_lm", level))
        if subject is None or base is None:
            continue  # a server or level that failed in this run: its pair is left out
        for key, figure in fig.items():
            figure.add("mlxd", subject[key])
            figure.add(figure.base, base[key])


async def _same_text(ctx: Context, adapters: list[Path], notes: list[str]) -> None:
    """Once: that an adapter changes the output on both servers, and whether they agree."""
    texts = {}
    for server in ("mlxd", "mlx_lm"):
        for level in (0, 1):
            t = rows(ctx, server, level, adapters, 1)[0]
            async with t.session() as http:
                msg = [{"role": "user", "content": "Say something about rivers."}]
                texts[(server, level)] = (await stream_chat(http, t, msg, 12, ctx.logit_bias)).text
    for server in ("mlxd", "mlx_lm"):
        if texts[(server, 0)] == texts[(server, 1)]:
            notes.append(f"{server}: adapter a0's greedy text equals the base's (no effect?)")
    same = {x: "agree" if texts[("mlxd", x)] == texts[("mlx_lm", x)] else "differ" for x in (0, 1)}
    notes.append(
        f"12 greedy tokens, mlxd vs mlx_lm.server: base {same[0]}, adapter a0 {same[1]} "
        "(on the CPU mlxd upcasts bf16 weights to float32: texts may differ there)"
    )


class AdapterRuns:
    """The workload, one run per call: every level on mlxd, the reference levels on mlx_lm."""

    def __init__(self, sz: AdapterSizes):
        self.sz, self.adapters, self.spec = sz, [], ""
        self.figs = figures(sz)
        self.shown = False

    def prepare(self, model: Path, work: Path) -> str:
        self.adapters = build_adapters(model, work / "adapters", self.sz)
        if self.adapters:
            config = json.loads((self.adapters[0] / "adapter_config.json").read_text())
            size = (self.adapters[0] / "adapters.safetensors").stat().st_size
            self.spec = f"{config['num_layers']} blocks adapted, {size / 1e6:.1f} MB each"
        return config_toml(self.adapters)

    async def _level(self, ctx: Context, server: str, level: int, notes: list[str]):
        targets = rows(ctx, server, level, self.adapters, self.sz.clients)
        # Untimed: each adapter of the level used once (into its slot; mlx_lm: its model load).
        await at_once(ctx, targets[: max(level, 1)], 16, 4, "warm")
        rs, wall = await at_once(ctx, targets, self.sz.prompt, self.sz.tokens, "adapters")
        short = [r.completion_tokens for r in rs if r.completion_tokens != self.sz.tokens]
        if short and not any(n.startswith(f"{server} short") for n in notes):
            notes.append(f"{server} short outputs @{_label(level)}: {short} of {self.sz.tokens}")
        return level_stats(rs, wall)

    def run(self, run: int) -> served.Workload:
        async def part(ctx: Context, notes: list[str]) -> list[Figure]:
            if ctx.worker is None:
                raise BenchError("adapters need the supervisor (`mlxd start`) and its config")
            if run == 0 and self.adapters:
                notes.append(f"adapters: {len(self.adapters)}, {self.spec}")
                await _same_text(ctx, self.adapters, notes)
                if any(x > 1 for x in self.sz.mlx_lm_levels):
                    notes.append(
                        "mlx_lm.server serves one model key (model, adapter) at a time: each "
                        "adapter change drains its batch and loads the model again"
                    )
            measured = {}
            for level in _order([0, *[x for x in self.sz.levels if x]], run):
                for server in _order(["mlxd", "mlx_lm"], run):
                    if server == "mlx_lm" and level not in self.sz.mlx_lm_levels:
                        continue
                    try:
                        measured[(server, level)] = await self._level(ctx, server, level, notes)
                    except SERVER_FAILED as exc:  # the other levels' figures still count
                        notes.append(f"run {run + 1}, {server} @{_label(level)}: failed: {exc}")
            add_run(self.figs, measured)
            first, self.shown = not self.shown, True
            return [f for fig in self.figs.values() for f in fig.values()] if first else []

        return part


HELP = {  # AdapterSizes' fields as flags (besides --repeats and --keys)
    "levels": "adapters the rows are spread over, per level (the base-only level always runs)",
    "clients": "requests at once per level",
    "prompt": "prompt tokens per request",
    "tokens": "output tokens per request",
    "rank": "LoRA rank",
    "lora_layers": "last blocks adapted",
    "mlx_lm_levels": "levels also sent to mlx_lm.server ('' for none; past 1 it reloads the "
    "model at every adapter switch)",
}


def main(argv: list[str]) -> int:
    d = AdapterSizes()
    p = served.parser("adapters", __doc__, d.repeats)
    for name, what in HELP.items():
        value = getattr(d, name)
        kind = served.ints if isinstance(value, tuple) else int
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=value, help=what)
    p.add_argument("--keys", choices=sorted(KEYS), default=d.keys, help="qv, or all linears")
    a = p.parse_args(argv)
    if any(x < 0 for x in a.levels) or not set(a.mlx_lm_levels) <= {0, *a.levels}:
        p.error("--levels: counts >= 0; --mlx-lm-levels: 0 or some of --levels")
    sz = AdapterSizes(**{f.name: getattr(a, f.name) for f in dataclasses.fields(AdapterSizes)})
    bench = AdapterRuns(sz)
    parts = [(f"adapters run {i + 1}", bench.run(i)) for i in range(sz.repeats)]
    text = (
        f"{sz.repeats} runs; {sz.clients} clients at once × {sz.prompt}+{sz.tokens} tok per "
        f"level, levels {'/'.join(map(str, sz.levels))} adapters and base only; LoRA rank "
        f"{sz.rank} on {sz.keys}, the last {sz.lora_layers} blocks at most, scale {SCALE:g}; "
        f"mlx_lm.server at {'/'.join(map(str, sz.mlx_lm_levels)) or 'none'}"
    )
    return served.main(a, parts, text, prepare=bench.prepare)
