"""Speech to text through a real daemon: a tiny random-weight Whisper (mlx-audio's own model
class), audio made here, the official `openai` SDK and Open WebUI's form.

One daemon for the module, with the Whisper model and a chat model. Random weights give
garbage text, so the oracle is mlx-audio's own `generate` on the same samples with the same
arguments: the daemon's transcript must be the library's, segment for segment.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

pytest.importorskip("mlx_audio", reason="mlx-audio is not installed (pip install 'mlxd[speech]')")

from tiny_whisper import build_tiny_whisper, tone, wav_bytes  # noqa: E402

from mlxd.shared.wire.audio import TranscriptionJob  # noqa: E402
from mlxd.worker.speech.transcribe import transcribe  # noqa: E402

TONE = wav_bytes(tone(2.0))
SRT_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)[,.](\d\d\d) --> (\d\d):(\d\d):(\d\d)[,.](\d\d\d)")


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    return build_tiny_whisper(tmp_path_factory.mktemp("tiny-whisper"))


@pytest.fixture(scope="module")
def d(module_daemon, whisper_dir, tiny_model_dir):
    return module_daemon(models={"whisper": whisper_dir, "chat": tiny_model_dir})


@pytest.fixture(scope="module")
def oai(d):
    return d.openai()


@pytest.fixture(scope="module")
def oracle(whisper_dir):
    """The library's own transcript of PCM with a job's arguments (in this process)."""
    from mlx_audio.stt import load

    model = load(whisper_dir)
    return lambda pcm, job: transcribe(model, pcm, job)


def _states(d) -> dict[str, str]:
    return {m["id"]: m["state"] for m in d.http.get("/admin/models").json()["data"]}


def _post(d, data: bytes, filename="a.wav", **fields) -> httpx.Response:
    fields.setdefault("model", "whisper")
    return d.http.post("/v1/audio/transcriptions", files={"file": (filename, data)}, data=fields)


def _seconds(m) -> list[float]:
    h, mi, s, ms = (int(x) for x in m)
    return h * 3600 + mi * 60 + s + ms / 1000


def _cue_times(text: str) -> list[tuple[float, float]]:
    return [(_seconds(m[:4]), _seconds(m[4:])) for m in SRT_TIME.findall(text)]


def test_wrong_kind_and_bad_uploads_load_nothing(d, oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.audio.transcriptions.create(model="chat", file=("a.wav", TONE))
    assert e.value.code == "model_type_mismatch" and "transcription" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="whisper", messages=[{"role": "user", "content": "hi"}])
    assert "/v1/audio/transcriptions" in e.value.message
    garbage = b"RIFF\x10\x00\x00\x00WAVEjunkjunkjunk"
    cases = [
        (_post(d, garbage), 400, "file"),
        (_post(d, b"hello, I am text", filename="a.txt"), 400, "file"),
        (_post(d, TONE, response_format="pdf"), 400, "response_format"),
        (_post(d, TONE, temperature="2"), 400, "temperature"),
        (_post(d, TONE, stream="true"), 400, "stream"),
        (_post(d, TONE, **{"timestamp_granularities[]": "word"}), 400, "timestamp_granularities"),
        (d.http.post("/v1/audio/transcriptions", files={"model": (None, "whisper")}), 400, "file"),
        # 31 minutes of 8 kHz 8-bit silence: refused from the WAV header alone
        (_post(d, _long_wav(31 * 60)), 413, "file"),
    ]
    for r, status, param in cases:
        assert r.status_code == status, (r.text, param)
        assert r.json()["error"]["param"] == param, r.text
    r = d.http.post("/v1/audio/transcriptions", json={"model": "whisper", "file": "x"})
    assert r.status_code == 415 and "multipart/form-data" in r.json()["error"]["message"]
    r = _post(d, b"\0" * (25 * 1024 * 1024 + 1))
    assert r.status_code == 413 and "MiB" in r.json()["error"]["message"]
    assert set(_states(d).values()) == {"stopped"}


def _long_wav(seconds: int) -> bytes:
    import io
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(8000)
        w.writeframes(b"\x80" * (8000 * seconds))
    return buf.getvalue()


def test_every_response_format_through_the_sdk(oai, oracle):
    job = TranscriptionJob(task="transcribe", response_format="verbose_json", duration_s=2.0)
    want = oracle(wav_pcm(TONE), job)
    verbose = oai.audio.transcriptions.create(
        model="whisper", file=("tone.wav", TONE), response_format="verbose_json"
    )
    assert verbose.text == want.text.strip() and verbose.duration == pytest.approx(2.0)
    assert [(s.start, s.end, s.tokens) for s in verbose.segments] == [
        (s["start"], s["end"], s["tokens"]) for s in want.segments
    ]
    starts = [s.start for s in verbose.segments]
    assert starts == sorted(starts) and all(s.start <= s.end for s in verbose.segments)
    plain = oai.audio.transcriptions.create(model="whisper", file=("tone.wav", TONE))
    assert plain.text == verbose.text
    text = oai.audio.transcriptions.create(
        model="whisper", file=("tone.wav", TONE), response_format="text"
    )
    assert text.strip() == verbose.text
    spoken = [s for s in verbose.segments if s.text.strip()]
    for fmt in ("srt", "vtt"):
        out = oai.audio.transcriptions.create(
            model="whisper", file=("tone.wav", TONE), response_format=fmt
        )
        times = _cue_times(out)
        assert times == [(round(s.start, 3), round(s.end, 3)) for s in spoken]
        assert out.startswith("WEBVTT\n\n" if fmt == "vtt" else "1\n" if spoken else "")


def wav_pcm(data: bytes) -> bytes:
    import io
    import wave

    with wave.open(io.BytesIO(data)) as w:
        return w.readframes(w.getnframes())


def test_translation_language_prompt_temperature_and_words(d, oai, oracle):
    job = TranscriptionJob(
        task="translate", language="de", prompt="Hallo", temperature=0.5, duration_s=2.0
    )
    want = oracle(wav_pcm(TONE), job)
    out = oai.audio.translations.create(
        model="whisper",
        file=("tone.wav", TONE),
        prompt="Hallo",
        temperature=0.5,
        response_format="verbose_json",
        extra_body={"language": "de"},
    )
    assert (out.text, out.language, out.task) == (want.text.strip(), "german", "translate")
    words = oai.audio.transcriptions.create(
        model="whisper",
        file=("tone.wav", TONE),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    assert isinstance(words.words, list)
    for w in words.words:
        assert w.start <= w.end
    with pytest.raises(openai.BadRequestError) as e:
        oai.audio.transcriptions.create(model="whisper", file=("a.wav", TONE), language="xx")
    assert e.value.param == "language"


def test_queued_requests_resampling_open_webui_form_and_metrics(d, oai):
    pid = d.worker_pids("whisper")
    # Three at once: queued on the one speech thread, each the same transcript.
    with ThreadPoolExecutor(3) as pool:
        texts = list(
            pool.map(
                lambda _: oai.audio.transcriptions.create(model="whisper", file=("t.wav", TONE)),
                range(3),
            )
        )
    assert len({t.text for t in texts}) == 1
    # 44.1 kHz stereo is resampled to 16 kHz mono: the same length of audio.
    stereo = wav_bytes(tone(2.0, rate=44_100).repeat(2), rate=44_100, channels=2)
    out = oai.audio.transcriptions.create(
        model="whisper", file=("s.wav", stereo), response_format="verbose_json"
    )
    assert out.duration == pytest.approx(2.0, abs=0.01)
    # Open WebUI (routers/audio.py, the OpenAI engine): requests' files + data, with the key.
    r = httpx.post(
        d.url + "/v1/audio/transcriptions",
        headers={"Authorization": "Bearer sk-anything"},
        files={"file": ("recording.wav", TONE)},
        data={"model": "whisper", "language": "en"},
        timeout=60,
    )
    assert r.status_code == 200 and isinstance(r.json()["text"], str)
    assert d.worker_pids("whisper") == pid  # nothing above cost the worker its life
    metrics = d.http.get("/metrics").text
    line = next(
        x for x in metrics.splitlines() if x.startswith('mlxd_audio_seconds_total{model="whisper"')
    )
    assert float(line.rsplit(" ", 1)[1]) >= 2.0 * 5


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg is not installed")
def test_compressed_formats_through_ffmpeg(d, tmp_path):
    src = tmp_path / "tone.wav"
    src.write_bytes(TONE)
    for ext in ("mp3", "ogg", "flac", "webm", "m4a"):
        out = tmp_path / f"tone.{ext}"
        subprocess.run(["ffmpeg", "-loglevel", "error", "-y", "-i", str(src), str(out)], check=True)
        r = _post(d, out.read_bytes(), filename=out.name, response_format="verbose_json")
        assert r.status_code == 200, (ext, r.text)
        assert r.json()["duration"] == pytest.approx(2.0, abs=0.1), ext
    r = _post(d, b"ID3" + b"\x00" * 400, filename="broken.mp3")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_audio"
