"""A transcript in each of OpenAI's response formats: json, text, srt, vtt, verbose_json.

Pure (no MLX): the unit tests read these shapes. Text is stripped of Whisper's leading space,
as OpenAI returns it; subtitle formats get one cue per segment that has text (a segment the
library cleared, silence, has none).
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from mlxd.shared.wire.audio import CONTENT_TYPES, TranscriptionJob

SEGMENT_KEYS = (
    ("id", int),
    ("seek", int),
    ("start", float),
    ("end", float),
    ("text", str),
    ("tokens", list),
    ("temperature", float),
    ("avg_logprob", float),
    ("compression_ratio", float),
    ("no_speech_prob", float),
)


def timestamp(seconds: float, decimal: str) -> str:
    """HH:MM:SS,mmm (SRT) or HH:MM:SS.mmm (WebVTT)."""
    ms = max(0, round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{decimal}{ms:03d}"


def _segment(seg: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, kind in SEGMENT_KEYS:
        value = seg.get(key, kind())
        if kind is list:
            out[key] = [int(t) for t in value]
        elif kind is str:
            out[key] = str(value)
        else:
            out[key] = kind(value) if value is not None else None
    return out


def _words(segments: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"word": str(w["word"]).strip(), "start": float(w["start"]), "end": float(w["end"])}
        for seg in segments
        for w in seg.get("words") or []
    ]


def _cues(segments: list[dict[str, Any]], decimal: str) -> list[tuple[str, str, str]]:
    cues = []
    for seg in segments:
        text = str(seg.get("text", "")).strip()
        if text:
            start, end = float(seg["start"]), float(seg["end"])
            cues.append((timestamp(start, decimal), timestamp(end, decimal), text))
    return cues


def render(
    job: TranscriptionJob,
    text: str,
    language: str | None,
    segments: list[dict[str, Any]],
    language_names: dict[str, str],
) -> tuple[bytes, str]:
    """The response body and its content type for `job.response_format`."""
    fmt = job.response_format
    text = text.strip()
    usage = {"type": "duration", "seconds": math.ceil(job.duration_s)}
    if fmt == "json":
        body = orjson.dumps({"text": text, "usage": usage})
    elif fmt == "verbose_json":
        out: dict[str, Any] = {
            "task": job.task,
            "language": language_names.get(language or "", language or ""),
            "duration": round(job.duration_s, 3),
            "text": text,
            "segments": [_segment(s) for s in segments],
            "usage": usage,
        }
        if job.words:
            out["words"] = _words(segments)
        body = orjson.dumps(out)
    elif fmt == "text":
        body = (text + "\n").encode()
    elif fmt == "srt":
        cues = _cues(segments, ",")
        body = "".join(f"{i}\n{a} --> {b}\n{t}\n\n" for i, (a, b, t) in enumerate(cues, 1)).encode()
    else:  # vtt
        cues = _cues(segments, ".")
        body = ("WEBVTT\n\n" + "".join(f"{a} --> {b}\n{t}\n\n" for a, b, t in cues)).encode()
    return body, CONTENT_TYPES[fmt]
