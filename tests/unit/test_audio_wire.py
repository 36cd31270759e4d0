"""Speech-to-text without MLX or processes: the form's bounds, the worker body, format
sniffing, WAV decoding and resampling, the model kind, and every response format's shape."""

from __future__ import annotations

import asyncio
import io
import json
import re
import wave

import numpy as np
import pytest

from mlxd.shared.errors import BadRequest, PayloadTooLarge
from mlxd.shared.model_facts import kind_refusal, read_model_facts
from mlxd.shared.wire.audio import TranscriptionJob, pack, parse_form, unpack
from mlxd.supervisor.http.audio import _add_field
from mlxd.supervisor.http.audio_decode import decode, read_wav, sniff
from mlxd.worker.speech.formats import render, timestamp


def _wav(samples: np.ndarray, rate: int, channels: int = 1, width: int = 2) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        if width == 1:
            w.writeframes((samples * 127 + 128).astype(np.uint8).tobytes())
        else:
            w.writeframes((samples * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def test_form_fields_and_their_bounds():
    form = parse_form({"model": "w", "temperature": "0.3", "timestamp_granularities": ["segment"]})
    assert (form.temperature, form.response_format) == (0.3, "json")
    job = form.to_job("translate", 2.5)
    assert (job.task, job.temperature, job.words, job.duration_s) == ("translate", 0.3, False, 2.5)
    for fields, param in [
        ({"response_format": "mp3"}, "response_format"),
        ({"temperature": "-1"}, "temperature"),
        ({"prompt": "x" * 5000}, "prompt"),
        ({"stream": "true"}, "stream"),
        ({"timestamp_granularities": ["word"]}, "timestamp_granularities"),
    ]:
        with pytest.raises(BadRequest) as e:
            parse_form(fields)
        assert e.value.param == param
    fields: dict = {}
    for name, value in [("model", "w"), ("timestamp_granularities[]", "word"), ("x", "1")]:
        _add_field(fields, name, value)
    _add_field(fields, "timestamp_granularities[]", "segment")
    assert fields == {"model": "w", "timestamp_granularities": ["word", "segment"], "x": "1"}


def test_worker_body_round_trip():
    job = TranscriptionJob(task="transcribe", prompt="a\nb", language="de", duration_s=1.0)
    pcm = np.arange(10, dtype="<i2").tobytes()
    assert unpack(pack(job, pcm)) == (job, pcm)
    for body in (b"no newline", b"{bad json}\n", pack(job, pcm + b"x")):
        with pytest.raises(BadRequest):
            unpack(body)


def test_formats_are_sniffed_by_content():
    assert sniff(_wav(np.zeros(10), 16000), "x.mp3") == "wav"
    assert sniff(b"fLaC" + b"\0" * 20) == "flac"
    assert sniff(b"OggS" + b"\0" * 20) == "ogg"
    assert sniff(b"\x1a\x45\xdf\xa3" + b"\0" * 20) == "webm"
    assert sniff(b"\0\0\0\x20ftypM4A " + b"\0" * 20) == "m4a"
    assert sniff(b"ID3\x04" + b"\0" * 20) == sniff(b"\xff\xfb\x90\x00") == "mp3"
    assert sniff(b"\xff\xf1\x50\x80\x02\x1f\xfc") == "aac"  # ADTS: layer bits 00
    assert sniff(b"ID3\x04\0\0\0\0\0\x02\0\0fLaC") == "flac"  # a tag, then FLAC
    assert sniff(b"plain text", "notes.wav") is None


def test_wav_is_mixed_to_mono_and_resampled_to_16k():
    t = np.arange(44100) / 44100
    left = 0.5 * np.sin(2 * np.pi * 300 * t)
    stereo = np.stack([left, left], axis=1).reshape(-1)
    audio = read_wav(_wav(stereo, 44100, channels=2), max_s=60)
    assert audio is not None and audio.duration_s == pytest.approx(1.0, abs=1e-3)
    x = np.frombuffer(audio.pcm, "<i2") / 32768
    want = 0.5 * np.sin(2 * np.pi * 300 * np.arange(len(x)) / 16000)
    assert np.abs(x - want).max() < 0.01
    eight = read_wav(_wav(np.zeros(8000), 8000, width=1), max_s=60)
    assert eight is not None and eight.duration_s == pytest.approx(1.0)
    assert np.abs(np.frombuffer(eight.pcm, "<i2")).max() < 300


def test_bad_and_long_audio_are_client_errors():
    with pytest.raises(BadRequest):
        asyncio.run(decode(b"RIFF\x10\x00\x00\x00WAVEjunkjunk", "a.wav", 60))
    with pytest.raises(BadRequest):
        asyncio.run(decode(_wav(np.zeros(0), 16000), "a.wav", 60))  # no samples
    with pytest.raises(PayloadTooLarge):
        asyncio.run(decode(_wav(np.zeros(16000 * 3), 16000), "a.wav", 2))


def test_whisper_folders_are_transcription_models(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    facts = read_model_facts(tmp_path, "w")
    assert (facts.type, facts.capabilities) == ("transcription", ["transcription"])
    assert kind_refusal(facts, "w", "transcription") is None
    assert "/v1/audio/transcriptions" in (kind_refusal(facts, "w", "chat") or "")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    chat = read_model_facts(tmp_path, "c")
    assert 'type = "transcription"' in (kind_refusal(chat, "c", "transcription") or "")
    assert read_model_facts(tmp_path, "c", "transcription").type == "transcription"


SEGMENTS = [
    {"id": 0, "seek": 0, "start": 0.0, "end": 1.5, "text": " Hello", "tokens": [1, 2]},
    {"id": 1, "seek": 0, "start": 1.5, "end": 1.5, "text": "", "tokens": []},
    {"id": 2, "seek": 0, "start": 61.25, "end": 3723.5, "text": " world", "tokens": [3]},
]


def _render(fmt: str, words: bool = False) -> tuple[str, str]:
    job = TranscriptionJob(task="transcribe", response_format=fmt, duration_s=2.2, words=words)
    body, ctype = render(job, " Hello world", "en", SEGMENTS, {"en": "english"})
    return body.decode(), ctype


def test_every_response_format():
    assert timestamp(3723.5, ",") == "01:02:03,500" and timestamp(0.0126, ".") == "00:00:00.013"
    body, ctype = _render("json")
    assert json.loads(body) == {"text": "Hello world", "usage": {"type": "duration", "seconds": 3}}
    assert ctype == "application/json"
    assert _render("text") == ("Hello world\n", "text/plain; charset=utf-8")
    srt, _ = _render("srt")
    assert (
        srt
        == "1\n00:00:00,000 --> 00:00:01,500\nHello\n\n2\n00:01:01,250 --> 01:02:03,500\nworld\n\n"
    )
    vtt, ctype = _render("vtt")
    assert ctype.startswith("text/vtt") and vtt.startswith("WEBVTT\n\n00:00:00.000 --> ")
    assert len(re.findall(" --> ", vtt)) == 2  # the empty segment has no cue
    verbose = json.loads(_render("verbose_json", words=True)[0])
    assert (verbose["language"], verbose["duration"], verbose["task"]) == (
        "english",
        2.2,
        "transcribe",
    )
    assert [s["start"] for s in verbose["segments"]] == [0.0, 1.5, 61.25]
    assert set(verbose["segments"][0]) >= {"avg_logprob", "no_speech_prob", "tokens", "seek"}
    assert verbose["words"] == []
