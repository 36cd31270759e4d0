"""What a model folder says about itself, read without MLX: architecture, parameter count,
quantization, context length, chat template and sampling defaults (Ollama's /api/tags and
/api/show show these).

Only small files are read: config.json, generation_config.json, the tokenizer config and the
safetensors headers (each bounded). Answers are cached per folder until its config changes.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from mlxd.shared.model_facts import serves_images
from mlxd.shared.sampling import NAMES as SAMPLING_NAMES

MAX_JSON_BYTES = 8 << 20  # a config or tokenizer config larger than this is not read
MAX_HEADER_BYTES = 64 << 20  # nor a safetensors header
# what /api/show lists of generation_config.json: the sampling fields, and the penalty
SAMPLING_DEFAULTS = (*SAMPLING_NAMES, "repetition_penalty")
DTYPE_LEVELS = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


@dataclass(frozen=True)
class FolderInfo:
    """One model folder as Ollama clients want to see it."""

    family: str = ""
    architecture: str = ""
    parameters: int = 0
    quantization: str = ""  # "Q4", "Q8", "BF16", ...
    context_length: int | None = None
    template: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)  # generation_config sampling values
    modified: float = 0.0  # the config's mtime (seconds since the epoch)
    digest: str = ""  # sha256 over the config and the weights' sizes: changes with the model
    config: dict[str, Any] = field(default_factory=dict)
    vision: bool = False  # a vision-language model mlxd serves images to

    @property
    def parameter_size(self) -> str:
        """The count as Ollama writes it: "8.0B", "494.03M"."""
        n = self.parameters
        if n >= 1e9:
            return f"{n / 1e9:.1f}B"
        if n >= 1e6:
            return f"{n / 1e6:.2f}M"
        return f"{n / 1e3:.2f}K" if n else ""

    @property
    def capabilities(self) -> list[str]:
        """What the chat template shows the model can do (a template that renders `tools`
        takes tools; one with a think block reasons)."""
        caps = ["completion"]
        if "tools" in self.template:
            caps.append("tools")
        if "<think>" in self.template or "enable_thinking" in self.template:
            caps.append("thinking")
        if self.vision:
            caps.append("vision")
        return caps


def folder_info(path: Path) -> FolderInfo:
    """The folder's info (cached until its config.json changes)."""
    try:
        stat = (path / "config.json").stat()
    except OSError:
        return FolderInfo()
    return _cached(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=256)
def _cached(path: Path, mtime_ns: int, size: int) -> FolderInfo:
    config = _read_json(path / "config.json")
    nested = config.get("text_config")  # multimodal configs keep the language model's here
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    quant = config.get("quantization") or config.get("quantization_config") or {}
    bits = quant.get("bits") if isinstance(quant, dict) else None
    level = (
        f"Q{bits}"
        if isinstance(bits, int)
        else DTYPE_LEVELS.get(str(config.get("torch_dtype") or text.get("torch_dtype") or ""), "")
    )
    tok = _read_json(path / "tokenizer_config.json")
    template = tok.get("chat_template")
    jinja = path / "chat_template.jinja"
    if not isinstance(template, str) and jinja.is_file() and jinja.stat().st_size < MAX_JSON_BYTES:
        template = jinja.read_text(errors="replace")
    gen = _read_json(path / "generation_config.json")
    archs = config.get("architectures")
    weights = sorted(path.glob("*.safetensors"))
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    for w in weights:
        digest.update(f"{w.name}:{_size(w)}".encode())
    return FolderInfo(
        family=str(config.get("model_type") or ""),
        architecture=str(archs[0]) if isinstance(archs, list) and archs else "",
        parameters=sum(_parameters(w, bits if isinstance(bits, int) else None) for w in weights),
        quantization=level,
        context_length=_int(text.get("max_position_embeddings")),
        template=template if isinstance(template, str) else "",
        defaults={k: gen[k] for k in SAMPLING_DEFAULTS if isinstance(gen.get(k), (int, float))},
        modified=mtime_ns / 1e9,
        digest=digest.hexdigest(),
        config=text,
        vision=serves_images(config),
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_json(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            return {}
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _parameters(path: Path, bits: int | None) -> int:
    """Parameters in one safetensors file, from its header; packed quantized weights (uint32
    with `.scales` beside them) count 32/bits parameters per element, scales and biases none."""
    try:
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_HEADER_BYTES:
                return 0
            header = json.loads(f.read(n))
        return _count(header, bits)
    except (OSError, ValueError, TypeError, AttributeError, struct.error):
        return 0  # an odd header is no reason to fail a listing


def _count(header: dict, bits: int | None) -> int:
    total = 0
    for name, t in header.items():
        if name == "__metadata__" or not isinstance(t, dict):
            continue
        stem = name.rsplit(".", 1)[0]
        if name.endswith((".scales", ".biases")) and f"{stem}.weight" in header:
            continue
        count = 1
        for d in t.get("shape") or []:
            count *= int(d)
        if bits and t.get("dtype") == "U32" and f"{stem}.scales" in header:
            count = count * 32 // bits
        total += count
    return total
