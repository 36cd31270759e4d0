"""One transcription on the speech thread: PCM in, the library's own result out.

The arguments are the ones `mlx_audio`'s Whisper `generate` takes, built in one place
(`generate_kwargs`) so a test can run the library itself on the same audio and compare: its
output is the oracle. OpenAI's `temperature` 0 means "raise the temperature on failure" —
Whisper's fallback ladder; another value is that one temperature. Sampling at a raised
temperature draws from MLX's global generator, seeded before every request, so one audio file
and one set of parameters always give one transcript.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from mlxd.shared.wire.audio import TranscriptionJob

FALLBACK = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # Whisper's own temperature ladder
SEED = 0


@dataclass
class Transcript:
    """What a transcription gave: the text, its language code, segments (and their words)."""

    text: str
    language: str | None
    segments: list[dict[str, Any]] = field(default_factory=list)


def pcm_to_audio(pcm: bytes) -> np.ndarray:
    """16-bit PCM → float32 samples in [-1, 1), as Whisper's own loader makes them."""
    return np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0


def generate_kwargs(job: TranscriptionJob) -> dict[str, Any]:
    """The library's `generate` arguments for `job`."""
    return {
        "language": job.language,
        "task": job.task,
        "initial_prompt": job.prompt,
        "temperature": FALLBACK if job.temperature == 0 else job.temperature,
        "word_timestamps": job.words,
        "verbose": None,  # no progress bar, no printing
    }


def transcribe(model: Any, pcm: bytes, job: TranscriptionJob) -> Transcript:
    """Run `model` on `pcm` (call only on the speech thread)."""
    mx.random.seed(SEED)
    out = model.generate(mx.array(pcm_to_audio(pcm)), **generate_kwargs(job))
    return Transcript(text=out.text, language=out.language, segments=list(out.segments or []))
