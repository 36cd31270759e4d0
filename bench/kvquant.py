"""`python -m bench kvquant`: KV bytes per token, decode speed and greedy agreement per KV scheme.

    python -m bench kvquant                     # the tiny random model, and SmolLM2 if installed
    python -m bench kvquant --model ~/models/Qwen3-8B --batch 8 --tokens 128

In one process, no HTTP: for the model's float KV, 8-bit and 4-bit (kv_bits, group size 64),
the engine's own generator (worker/engine/generator.py) decodes a fixed set of prompts greedily
in one batch (end-of-sequence banned, so every row runs the same length), then one of them
alone. Reported per scheme:

- KV bytes per token: the memory plan's figure (shared/kv_math.py) and what the batch's caches
  hold, measured (their bytes over rows x positions held);
- decode tok/s at batch 1 and at the batch (median of --repeats runs);
- greedy agreement with the float run: `same` is the share of generated positions whose token
  equals the float run's (a first difference changes the rest of that row, so this counts
  drift); `forced` is top-1 agreement under teacher forcing (the float run's text fed through
  the quantized cache: each position judged on its own), the usual KV-quantization figure.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEMES = (None, 8, 4)
PROMPTS = (
    "The history of the printing press begins",
    "Write a short poem about the sea at night.",
    "Explain how a hash table handles collisions.",
    "List three facts about the planet Mars:",
    "def fibonacci(n):\n    ",
    "The recipe for a simple bread needs flour, water,",
    "In 1969, the first humans to walk on the Moon",
    "Translate to French: The cat sleeps on the warm windowsill.",
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench kvquant", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, action="append", help="mlx-lm model folder (repeatable)")
    p.add_argument("--batch", type=int, default=len(PROMPTS), help="rows decoded together")
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per row")
    p.add_argument("--repeats", type=int, default=3, help="runs per speed figure (median shown)")
    p.add_argument("--group-size", type=int, default=64, help="kv_group_size of the quantized runs")
    return p.parse_args(argv)


def default_models(work: Path) -> list[tuple[str, Path]]:
    """The tiny random model, plus the built-in SmolLM2 (imported from its GGUF) if installed."""
    from mlxd.shared.builtin_model import BUILTIN_MODEL_ID, find_builtin_gguf

    from .models import build_model

    out = [("random-weight tiny", build_model("tiny", work / "tiny"))]
    gguf = find_builtin_gguf()
    if gguf is not None:
        from mlxd.worker.importers.gguf import import_gguf

        out.append((BUILTIN_MODEL_ID, import_gguf(gguf, work, BUILTIN_MODEL_ID)))
    return out


def greedy(
    loaded, prompts: list[list[int]], n: int, bias: dict
) -> tuple[list[list[int]], float, int]:
    """Each row's n greedy tokens, decode tok/s once every row decodes, measured KV bytes per
    token (the batch caches' bytes over rows x positions held, just before the end)."""
    import mlx.core as mx

    from mlxd.shared.params import GenerationParams
    from mlxd.worker.engine.step.generator import decode_batch, make_generator
    from mlxd.worker.engine.step.sampling import RowSampling

    params = GenerationParams(max_tokens=n, temperature=0.0, logit_bias=bias)
    stream = mx.new_stream(mx.default_device())
    gen = make_generator(loaded.model, batch=len(prompts), chunk=512, stream=stream)
    uids = gen.insert(
        prompts, max_tokens=[n] * len(prompts), samplers=[RowSampling(params) for _ in prompts]
    )
    out: dict[int, list[int]] = {u: [] for u in uids}
    t0, count, measured = None, 0, 0
    try:
        while any(len(v) < n for v in out.values()):
            batch = decode_batch(gen)
            if len(batch) == len(prompts) and min(len(v) for v in out.values()) == n - 2:
                caches = batch.prompt_cache
                held = caches[0].keys[0].shape[2] if isinstance(caches[0].keys, tuple) else None
                held = held or caches[0].keys.shape[2]
                measured = sum(c.nbytes for c in caches) // (len(prompts) * held)
            _, responses = gen.next()
            if t0 is None and len(responses) == len(prompts):
                t0, count = time.perf_counter(), 0
            count += len(responses)
            for r in responses:
                out[r.uid].append(r.token)
        tps = (count - len(prompts)) / (time.perf_counter() - t0) if t0 else 0.0
    finally:
        gen.close()
    return [out[u] for u in uids], tps, measured


def forced_agreement(loaded, prompts: list[list[int]], reference: list[list[int]]) -> float:
    """Top-1 agreement, position by position, of this model's KV scheme with the reference
    tokens fed in (one forward per row through a fresh cache of the scheme)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    same = total = 0
    for prompt, ref in zip(prompts, reference):
        cache = make_prompt_cache(loaded.model)
        seq = mx.array([prompt + ref[:-1]])
        logits = loaded.model(seq, cache=cache)[0, len(prompt) - 1 :]
        picks = mx.argmax(logits, axis=-1).tolist()
        same += sum(a == b for a, b in zip(picks, ref))
        total += len(ref)
    return same / total


def run_model(label: str, path: Path, a: argparse.Namespace) -> list[str]:
    from mlxd.worker.model.load import load_model

    from .models import no_eos_bias

    bias = {int(k): v for k, v in no_eos_bias(path).items()}
    rows, reference, forced_ref = [], None, None
    for bits in SCHEMES:
        loaded = load_model(path, "kvquant", kv_bits=bits, kv_group_size=a.group_size)
        tok = loaded.tokenizer
        prompts = [tok.encode(PROMPTS[i % len(PROMPTS)]) for i in range(a.batch)]
        runs = [greedy(loaded, prompts, a.tokens, bias) for _ in range(a.repeats)]
        tokens, _, measured = runs[0]
        tps_b = statistics.median(r[1] for r in runs)
        tps_1 = statistics.median(
            greedy(loaded, prompts[:1], a.tokens, bias)[1] for _ in range(a.repeats)
        )
        if reference is None:
            reference = tokens
            forced_ref = forced_agreement(loaded, prompts, reference)
        same = sum(x == y for r, q in zip(reference, tokens) for x, y in zip(r, q))
        same_share = same / sum(len(r) for r in reference)
        forced = forced_agreement(loaded, prompts, reference)
        name = "float" if bits is None else f"{bits}-bit"
        rows.append(
            f"| {label} | {name} | {loaded.kv_bytes_per_token} | {measured} | {tps_1:.1f} |"
            f" {tps_b:.1f} | {same_share:.3f} | {forced:.3f} |"
        )
        print(rows[-1], flush=True)
    if forced_ref is not None and forced_ref < 0.999:
        rows.append(f"(the float run agrees with itself teacher-forced at {forced_ref:.3f})")
    return rows


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    import mlx.core as mx

    work = Path(tempfile.mkdtemp(prefix="mlxd-kvquant-"))
    models = [(str(m), m.resolve()) for m in a.model] if a.model else default_models(work)
    print(f"device {mx.default_device()} · mlx {mx.__version__} · batch {a.batch} ·")
    print(f"{a.tokens} tokens per row · group size {a.group_size} · median of {a.repeats}\n")
    print("| model | KV | bytes/token (plan) | bytes/token (held) | tok/s batch 1 |", end="")
    print(f" tok/s batch {a.batch} | same | forced |")
    print("|---|---|---|---|---|---|---|---|")
    for label, path in models:
        run_model(label, path, a)
    return 0
