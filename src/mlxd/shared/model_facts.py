"""What a model folder says about itself, read from its JSON files (never by importing MLX).

Both processes use it: the supervisor for model cards and for refusing a request the model
cannot serve before anything is loaded, the worker to pick its loader and pooling. The kind
(`chat`, `embedding` or `transcription`) comes from, in order: an explicit override (a model's
`type` in config.toml), a speech-to-text family in config.json (Whisper: `model_type` or the
architecture), `is_embedding` in config.json, a sentence-transformers layout (`modules.json` with
a Pooling module, or `1_Pooling/config.json`), an architecture or model name with "Embedding"
in it, an encoder-only architecture (BERT and kin); everything else is a chat model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

ModelType = Literal["chat", "embedding", "transcription"]
Pooling = Literal["last", "mean", "cls"]
MODEL_TYPES: tuple[ModelType, ...] = ("chat", "embedding", "transcription")
# Speech-to-text families the speech worker serves (worker/speech/), by config.json's
# model_type, and their architecture names as transformers' folders state them.
SPEECH_TYPES = frozenset({"whisper"})
_SPEECH_ARCH = re.compile(r"^Whisper", re.IGNORECASE)

# Encoder-only families: embedders by nature, but not loadable through mlx-lm (docs/api.md).
ENCODER_TYPES = frozenset(
    {
        "bert",
        "roberta",
        "xlm-roberta",
        "distilbert",
        "mpnet",
        "nomic_bert",
        "modernbert",
        "new",
        "electra",
        "deberta-v2",
    }
)
# The vision-language families whose images mlxd serves (worker/vision/): model_type -> the
# tokens that sit inside one image's run of image tokens besides them (Pixtral's row break).
# Their text models load through mlx-lm with ordinary positions; Qwen-VL's M-RoPE does not yet.
VISION_FAMILIES: dict[str, tuple[str, ...]] = {
    "gemma3": (),
    "mistral3": ("[IMG_BREAK]",),
}


def serves_images(config: dict[str, Any]) -> bool:
    """Whether a config.json is a vision-language model of a family mlxd serves images to."""
    return config.get("model_type") in VISION_FAMILIES and isinstance(
        config.get("vision_config"), dict
    )


_EMBED_NAME = re.compile(r"embed", re.IGNORECASE)
# Markers a chat template uses when the model can think before it answers.
_REASONING_MARKERS = ("<think>", "enable_thinking", "reasoning_content", "thinking")
# model_max_length in tokenizer configs is often a "no limit" sentinel (1e30).
_MAX_SANE_CONTEXT = 1 << 24
_POOLING_KEYS: tuple[tuple[str, Pooling], ...] = (
    ("pooling_mode_lasttoken", "last"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_cls_token", "cls"),
)


@dataclass(frozen=True)
class ModelFacts:
    """A model folder's kind, shape and features, as its files state them."""

    type: ModelType
    architecture: str | None = None  # architectures[0] of config.json
    model_type: str | None = None  # config.json's model_type
    context_length: int | None = None  # the model's own (max_position_embeddings)
    hidden_size: int | None = None  # an embedding model's vector width
    pooling: Pooling = "last"  # how an embedding model turns hidden states into one vector
    quantization: dict[str, Any] | None = None  # {"bits", "group_size", "mode"} or a method
    dtype: str | None = None
    tools: bool = False  # the chat template renders tools
    reasoning: bool = False  # the chat template knows thinking markers
    vision: bool = False  # a vision tower of a family mlxd serves images to (VISION_FAMILIES)
    chat_template: bool = False

    @property
    def encoder_only(self) -> bool:
        """An encoder (BERT-family) model: mlx-lm cannot load it."""
        return (self.model_type or "").lower() in ENCODER_TYPES

    @property
    def capabilities(self) -> list[str]:
        """What mlxd serves for this model: "embedding", or chat's "completion", "tools",
        "reasoning", "vision"."""
        if self.type in ("embedding", "transcription"):
            return [self.type]
        flags = (("tools", self.tools), ("reasoning", self.reasoning), ("vision", self.vision))
        return ["completion"] + [name for name, on in flags if on]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _chat_template(path: Path, tokenizer_config: dict[str, Any]) -> str:
    """The chat template text, wherever the folder keeps it (several templates: all of them)."""
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        template = "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    if isinstance(template, str) and template:
        return template
    try:
        return (path / "chat_template.jinja").read_text(encoding="utf-8")
    except OSError:
        pass
    template = _read_json(path / "chat_template.json").get("chat_template")
    return template if isinstance(template, str) else ""


def _sentence_transformers_pooling(path: Path) -> Pooling | None:
    """The pooling a sentence-transformers folder declares (None: not such a folder)."""
    folder = "1_Pooling"
    modules = path / "modules.json"
    if modules.is_file():
        try:
            entries = json.loads(modules.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            entries = []
        for m in entries if isinstance(entries, list) else []:
            if isinstance(m, dict) and str(m.get("type", "")).endswith("Pooling"):
                folder = str(m.get("path") or folder)
                break
        else:
            return None
    pooling_file = path / folder / "config.json"
    if not pooling_file.is_file():
        return "last" if modules.is_file() else None
    cfg = _read_json(pooling_file)
    for key, mode in _POOLING_KEYS:
        if cfg.get(key) is True:
            return mode
    return "last"


def _quantization(config: dict[str, Any]) -> dict[str, Any] | None:
    q = config.get("quantization")
    if isinstance(q, dict) and _int(q.get("bits")):
        return {
            "bits": q["bits"],
            "group_size": _int(q.get("group_size")),
            "mode": str(q.get("mode") or "affine"),
        }
    qc = config.get("quantization_config")
    if isinstance(qc, dict) and qc.get("quant_method"):
        out: dict[str, Any] = {"method": str(qc["quant_method"])}
        if _int(qc.get("bits")):
            out["bits"] = qc["bits"]
        return out
    return None


def read_model_facts(path: Path, name: str = "", override: ModelType | None = None) -> ModelFacts:
    """The facts of the model folder at `path`; `name` is its id (a name pattern hints the
    kind), `override` the configured kind. A folder without a readable config is a chat
    model with no facts (loading it will say what is wrong)."""
    config = _read_json(path / "config.json")
    raw_text = config.get("text_config")
    text: dict[str, Any] = raw_text if isinstance(raw_text, dict) else {}
    tok_config = _read_json(path / "tokenizer_config.json")
    archs = config.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    st_pooling = _sentence_transformers_pooling(path)

    kind: ModelType = "chat"
    if override in MODEL_TYPES:
        kind = override
    elif (model_type or "").lower() in SPEECH_TYPES or _SPEECH_ARCH.search(arch or ""):
        kind = "transcription"
    elif config.get("is_embedding") is True or st_pooling is not None:
        kind = "embedding"
    elif any(_EMBED_NAME.search(s) for s in (arch or "", name, path.name) if s):
        kind = "embedding"
    elif (model_type or "").lower() in ENCODER_TYPES:
        kind = "embedding"

    context = _int(config.get("max_position_embeddings")) or _int(
        text.get("max_position_embeddings")
    )
    if context is None and (n := _int(tok_config.get("model_max_length"))):
        context = n if n < _MAX_SANE_CONTEXT else None
    template = _chat_template(path, tok_config)
    dtype = config.get("torch_dtype") or config.get("dtype") or text.get("torch_dtype")
    return ModelFacts(
        type=kind,
        architecture=arch,
        model_type=model_type,
        context_length=context,
        hidden_size=_int(config.get("hidden_size")) or _int(text.get("hidden_size")),
        pooling=st_pooling or "last",
        quantization=_quantization(config),
        dtype=dtype if isinstance(dtype, str) else None,
        tools="tools" in template,
        reasoning=any(m in template for m in _REASONING_MARKERS),
        vision=serves_images(config),
        chat_template=bool(template),
    )


_ROUTES_OF: dict[ModelType, str] = {
    "chat": "a chat or completion route",
    "embedding": "POST /v1/embeddings",
    "transcription": "POST /v1/audio/transcriptions or /v1/audio/translations",
}


def adapter_refusal(facts: ModelFacts, model_id: str) -> str | None:
    """Why `model_id` mounts no LoRA adapter (None: it may): adapters change generation, and
    an embedding or speech model's output would silently stay the base model's."""
    if facts.type == "chat":
        return None
    return (
        f"The model '{model_id}' is {_A[facts.type]} model: LoRA adapters are mounted on "
        "models that generate text"
    )


def kind_refusal(facts: ModelFacts, model_id: str, wants: ModelType) -> str | None:
    """Why a request wanting a `wants` model cannot go to this one (None: it can)."""
    if wants == "embedding" and facts.type == "embedding" and facts.encoder_only:
        return (
            f"The model '{model_id}' is an encoder ({facts.model_type}) embedding model; mlxd "
            "serves decoder embedding models (e.g. Qwen3-Embedding) through mlx-lm only"
        )
    if facts.type == wants:
        return None
    if wants == "chat":
        return (
            f"The model '{model_id}' is {_A[facts.type]} model: use {_ROUTES_OF[facts.type]} "
            "with it, not a chat or completion route"
        )
    return (
        f"The model '{model_id}' is {_A[facts.type]} model and does not serve "
        f'{_ROUTES_OF[wants]}; use {_A[wants]} model, or set type = "{wants}" in its '
        f'[models."{model_id}"] section'
    )


_A: dict[ModelType, str] = {
    "chat": "a chat",
    "embedding": "an embedding",
    "transcription": "a speech-to-text (transcription)",
}
