"""`python -m bench speculative`: decode tok/s with and without speculative decoding.

    python -m bench speculative --builtin            # SmolLM2-135M (the built-in model), CPU
    python -m bench speculative --shape qwen3-0.6b   # random weights: prompt lookup only
    python -m bench speculative --model ~/models/Qwen3-8B --draft ~/models/Qwen3-0.6B

One process, our engine, one greedy row at a time, on two prompts:
- `code-edit`: the model is asked to repeat a long snippet with a small change (what a coding
  agent's file rewrite looks like: the answer is mostly the prompt);
- `free-writing`: an open-ended question (little to look up).
For each mode (off, ngram, and draft when --draft is given) it prints decode tok/s (median of
the runs, and their spread), the acceptance rate, and whether the text equals mode off's.
On random weights a draft model accepts nothing and the text is noise; prompt lookup still
finds the repeated snippet when the model copies (real models do; random ones rarely).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNIPPET = '''def load_settings(path):
    """Read the settings file and return a dict of its values."""
    values = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values
'''
PROMPTS = {
    "code-edit": "Here is a Python function:\n\n"
    + SNIPPET
    + "\nRewrite the whole function with the name read_settings instead of load_settings. "
    "Reply with the code only.",
    "free-writing": "Write a short story about a lighthouse keeper who finds a message in a "
    "bottle.",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench speculative", description=__doc__.splitlines()[0]
    )
    p.add_argument("--model", type=Path, help="mlx-lm model folder")
    p.add_argument("--builtin", action="store_true", help="the built-in SmolLM2-135M")
    p.add_argument("--shape", help="random-weight shape (default: tiny)")
    p.add_argument("--draft", type=Path, help="a draft model folder (same tokenizer)")
    p.add_argument("--k", type=int, default=4, help="tokens drafted per step")
    p.add_argument("--tokens", type=int, default=256, help="tokens generated per run")
    p.add_argument("--repeats", type=int, default=3, help="runs per figure (median shown)")
    return p.parse_args(argv)


def _model(a: argparse.Namespace) -> Path:
    if a.model:
        return a.model.resolve()
    from .models import MODEL_CACHE as cache

    if a.builtin:
        from mlxd.shared.builtin_model import BUILTIN_MODEL_ID, find_builtin_gguf
        from mlxd.worker.importers.gguf import import_gguf

        folder = cache / BUILTIN_MODEL_ID
        if not (folder / "config.json").is_file():
            gguf = find_builtin_gguf()
            if gguf is None:
                sys.exit("the built-in model is not installed (make install)")
            import_gguf(gguf, cache, BUILTIN_MODEL_ID, overwrite=True)
        return folder
    from .models import cached_model

    return cached_model(a.shape or "tiny")


def run_once(engine, prompt: list[int], n: int, bias: dict) -> tuple[float, str, int]:
    """Decode tok/s after the first token, the text, and the tokens generated."""
    from mlxd.shared.params import GenerationParams
    from mlxd.worker.engine.rows import Submission

    params = GenerationParams(max_tokens=n, temperature=0.0, logit_bias=bias)
    done = threading.Event()
    state: dict = {"t0": None, "n": 0, "text": []}

    def sink(ev) -> None:
        if state["t0"] is None:
            state["t0"] = time.perf_counter()
        state["n"] = ev.completion_tokens
        state["text"].append(ev.text)
        if ev.finish_reason is not None:
            state["t1"] = time.perf_counter()
            done.set()

    engine.submit(Submission("spec", list(prompt), params, sink))
    done.wait()
    took = state["t1"] - state["t0"]
    return (state["n"] - 1) / took if took > 0 else 0.0, "".join(state["text"]), state["n"]


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    import mlx.core as mx

    from mlxd.worker.engine.draft_model import load_draft, spec_config
    from mlxd.worker.engine.loop import Engine
    from mlxd.worker.model.load import load_model

    path = _model(a)
    # Random weights end anywhere: ban end-of-sequence there, as `bench run` does.
    bias = {}
    if not (a.model or a.builtin):
        from .models import no_eos_bias

        bias = {int(k): v for k, v in no_eos_bias(path).items()}
    loaded = load_model(path, "bench")
    draft = load_draft(a.draft, loaded) if a.draft else None
    modes = ["off", "ngram"] + (["draft"] if draft else [])
    print(f"model {path} · draft {a.draft or '-'} · device {mx.default_device()}")
    print(f"greedy, {a.tokens} tokens, k={a.k}, median of {a.repeats} (spread: min-max)\n")
    print("| prompt | mode | tok/s | spread | vs off | accepted | same text |")
    print("|---|---|---|---|---|---|---|")
    tok = loaded.tokenizer
    engines = {}
    for mode in modes:  # every mode's engine up front, runs interleaved: no order effect
        spec = spec_config(mode, a.k, draft)
        engines[mode] = engine = Engine(loaded, batch=8, spec=spec)
        engine.start()
        engine.warmed.wait()
    for name, text in PROMPTS.items():
        msgs = [{"role": "user", "content": text}]
        try:
            prompt = tok.apply_chat_template(msgs, add_generation_prompt=True)
        except Exception:  # a folder without a chat template
            prompt = tok.encode(text)
        for engine in engines.values():
            run_once(engine, prompt, 8, bias)  # the verify shapes' kernels, before the clock
        before = {m: _counts(e.spec) for m, e in engines.items()}
        runs: dict[str, list] = {m: [] for m in modes}
        for _ in range(a.repeats):
            for mode, engine in engines.items():
                runs[mode].append(run_once(engine, prompt, a.tokens, bias))
        base = statistics.median(r[0] for r in runs["off"])
        for mode in modes:
            tps = [r[0] for r in runs[mode]]
            mid = statistics.median(tps)
            drafted, accepted = (x - y for x, y in zip(_counts(engines[mode].spec), before[mode]))
            rate = f"{accepted / drafted:.0%}" if drafted else "-"
            same = "yes" if runs[mode][0][1] == runs["off"][0][1] else "NO"
            print(
                f"| {name} | {mode} | {mid:.1f} | {min(tps):.1f}-{max(tps):.1f} | "
                f"{mid / base:.2f}x | {rate} | {same} |",
                flush=True,
            )
    for engine in engines.values():
        engine.stop()
        engine.join(60)
    return 0


def _counts(spec) -> tuple[int, int]:
    return (spec.stats.drafted, spec.stats.accepted) if spec else (0, 0)
