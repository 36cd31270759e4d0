"""Load a speech-to-text model folder through mlx-audio (an optional dependency: `mlxd[speech]`).

mlx-audio's Whisper is its own MLX model class (no torch, no numba) with a Hugging Face
tokenizer read from the folder, so a folder works offline. Only Whisper is served for now:
its `generate` gives segments with timestamps, which every response format needs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxd.shared.model_facts import SPEECH_TYPES, ModelFacts

log = logging.getLogger("mlxd.worker.speech")

MISSING = (
    "serving speech-to-text models needs mlx-audio: pip install 'mlxd[speech]' "
    "(or mlx-audio) into mlxd's environment"
)


@dataclass
class SpeechModel:
    """A loaded speech model and what the handlers need of it."""

    model: Any  # mlx-audio's Whisper Model
    model_id: str
    path: Path
    weights_bytes: int
    languages: dict[str, str]  # code → name, as Whisper knows them
    multilingual: bool


def load_speech(path: Path, model_id: str, facts: ModelFacts) -> SpeechModel:
    """Load `path`; raises on any problem (the caller maps it to an exit code)."""
    if (facts.model_type or "").lower() not in SPEECH_TYPES:
        raise ValueError(
            f"model_type {facts.model_type!r} is not a speech family mlxd serves "
            f"({', '.join(sorted(SPEECH_TYPES))})"
        )
    try:
        from mlx.utils import tree_flatten
        from mlx_audio.stt import load
        from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES
    except ImportError as exc:
        raise RuntimeError(f"{MISSING} ({exc})") from None
    model = load(path)
    if getattr(model, "_processor", None) is None:
        raise ValueError(f"{path} has no Whisper tokenizer files (tokenizer.json and its config)")
    nbytes = sum(v.nbytes for _, v in dict(tree_flatten(model.parameters())).items())
    log.info(
        "speech model=%s weights=%d bytes multilingual=%s", model_id, nbytes, model.is_multilingual
    )
    return SpeechModel(
        model=model,
        model_id=model_id,
        path=path,
        weights_bytes=nbytes,
        languages=dict(LANGUAGES),
        multilingual=bool(model.is_multilingual),
    )
