"""What `python -m bench vision` runs on: the random-weight VLM shapes and their build, the
PNG images, each side's message content, the run's sizes and the figures it fills."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .context import Figure

ROOT = Path(__file__).resolve().parents[1]
BASE = "mlx_vlm"
COLD = "mlxd_turn1"  # mlxd's own turn 1 beside its turn 2, paired by run
_MARKER = ".bench-vlm.json"  # written last: a folder without it is an interrupted build

# google/gemma-3-4b-it's sizes: the text model (5 sliding-window layers of 1,024 tokens to 1
# global), the SigLIP tower at 896 px (4,096 patches of 14 px, pooled to 256 image tokens).
# The vocabulary is the real one, so the LM head (tied to the embeddings) costs what it costs;
# the tokenizer is tests/tiny_vlm.py's BPE padded to that many ids.
SHAPES: dict[str, dict] = {
    "gemma3-4b": {
        "text": {
            "hidden_size": 2560,
            "num_hidden_layers": 34,
            "intermediate_size": 10240,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "query_pre_attn_scalar": 256,
            "sliding_window": 1024,
            "sliding_window_pattern": 6,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "max_position_embeddings": 131072,
            "mm_tokens_per_image": 256,
        },
        "vision": {
            "hidden_size": 1152,
            "num_hidden_layers": 27,
            "num_attention_heads": 16,
            "intermediate_size": 4304,
            "image_size": 896,
            "patch_size": 14,
        },
        "top": {"mm_tokens_per_image": 256},
        "vocab_size": 262208,
        "dtype": "bfloat16",
    },
}
NAMES = ("tiny", *SHAPES)  # tiny: tests/tiny_vlm.py's gemma3 as it is (32 px, 4 image tokens)


@dataclass(frozen=True)
class VisionSizes:
    """How big each part is (the CLI's flags)."""

    repeats: int = 3
    image_px: int = 1024  # the PNGs sent, a side (the processor resizes them)
    question: int = 200  # tokens of each question
    reply: int = 16  # tokens out per turn
    clients: int = 8
    image_rows: int = 4  # of the clients, rows with an image
    mix_tokens: int = 64


HELP = {
    "image_px": "side of each PNG sent, pixels",
    "question": "tokens of each question",
    "reply": "turns: tokens out per turn",
    "clients": "mix: requests at once",
    "image_rows": "mix: how many of them carry an image",
    "mix_tokens": "mix: tokens out per request",
}


def build(shape: str, dest: Path, seed: int = 0) -> Path:
    """Write the random-weight VLM folder of `shape` at `dest` (reused when complete). The
    large shapes are drawn by MLX on the default device, bf16, written shard by shard."""
    marker = dest / _MARKER
    want = {"shape": shape, "seed": seed, "format": 1}
    if marker.exists() and json.loads(marker.read_text()) == want:
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    from .models import _write_shards, tests_module

    builder = tests_module("tiny_vlm").build_vlm
    if shape == "tiny":
        builder(dest, "gemma3", seed)
    else:
        builder(dest, "gemma3", seed, sizes=SHAPES[shape], write_weights=_write_shards)
    marker.write_text(json.dumps(want))
    return dest


def build_in_child(shape: str, dest: Path) -> Path:
    """build() in a fresh interpreter: the bench process never holds MLX or its buffers."""
    code = "import sys; from pathlib import Path; from bench.vision_setup import build; "
    code += "build(sys.argv[1], Path(sys.argv[2]))"
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", code, shape, str(dest)], check=True, cwd=ROOT)
    print(f"model ready in {time.monotonic() - t0:.0f}s: {dest}", flush=True)
    return dest


def write_png(seed: int, px: int, dest: Path) -> Path:
    """A deterministic px×px PNG of random pixels (each seed its own image: no cache hits)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.RandomState(seed).randint(0, 256, (px, px, 3), dtype=np.uint8)
    Image.fromarray(pixels, "RGB").save(dest, format="PNG")
    return dest


def openai_parts(text: str, image: Path | None) -> list[dict] | str:
    """A user message's content: the image as a data: URL first, then the text."""
    if image is None:
        return text
    url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]


def vlm_parts(text: str, image: Path | None) -> list[dict] | str:
    """The same content as mlx-vlm's chat template takes it (the image passed by path)."""
    return text if image is None else [{"type": "image"}, {"type": "text", "text": text}]


def figures(sz: VisionSizes) -> dict[str, Figure]:
    """Every figure of the run, mlxd against mlx-vlm unless said otherwise."""
    img = f"{sz.image_px}² image + {sz.question} tok"
    mix = f"mix ×{sz.clients} ({sz.image_rows} image, {sz.clients - sz.image_rows} text)"
    f = lambda workload, metric, unit, hib, **kw: Figure(  # noqa: E731
        workload, metric, unit, hib, base=BASE, **kw
    )
    return {
        "cold": f("image turn 1", f"TTFT, new {img}", "s", False),
        "warm": f(
            "image turn 2",
            f"TTFT, same image, new {sz.question} tok question",
            "s",
            False,
            note="mlx-vlm: with its own PromptCacheState carried from turn 1.",
        ),
        "hit": Figure("image turn 2", "prompt from cache", "%", True, base=""),
        "vs_cold": Figure(
            "image turn 2", "mlxd TTFT turn 2 / turn 1", "s", False, base=COLD, paired=True
        ),
        "wall": f(mix, f"wall ({sz.mix_tokens} tok out each)", "s", False),
        "agg": f(mix, "aggregate output tok/s", "tok/s", True),
        "p50": f(mix, "TTFT p50, all rows", "s", False),
        "p90": f(mix, "TTFT p90, all rows", "s", False),
        "img50": f(mix, "TTFT p50, image rows", "s", False),
        "txt50": f(mix, "TTFT p50, text rows", "s", False),
    }
