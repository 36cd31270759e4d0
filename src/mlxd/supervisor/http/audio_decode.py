"""An uploaded audio file → 16 kHz mono 16-bit PCM, with its duration, in the supervisor.

Decoding here, before any lease or load, makes bad audio a 400 for that request alone and
never a worker's problem: the worker only ever sees PCM. WAV (integer PCM) is read with the
standard library; every other format (and WAV in float or extensible encodings) goes through
`ffmpeg` as a child process with a deadline, on a temporary file (an MP4/M4A's index may sit
at its end, which a pipe cannot seek to). A decoder's crash is its own process's.
"""

from __future__ import annotations

import asyncio
import io
import logging
import shutil
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path

from mlxd.shared.errors import BadRequest, MlxdError, PayloadTooLarge
from mlxd.shared.wire.audio import SAMPLE_BYTES, SAMPLE_RATE

log = logging.getLogger("mlxd.audio")

FORMATS = ("aac", "flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "ogg", "wav", "webm")
DECODE_TIMEOUT_S = 120.0  # a decoder that takes longer is killed: a 400 for its request
# ffmpeg's demuxer for each sniffed container. It is always named: left to probe the bytes
# itself, ffmpeg skips an ID3 tag and may find a playlist (HLS, concat) whose entries are
# files on this machine, which it would then read and decode: an upload must never open
# anything but itself.
DEMUXERS = {
    "aac": "aac",
    "flac": "flac",
    "m4a": "mov",
    "mp4": "mov",
    "mp3": "mp3",
    "mpeg": "mp3",
    "mpga": "mp3",
    "ogg": "ogg",
    "wav": "wav",
    "webm": "matroska",
}


@dataclass(frozen=True)
class Audio:
    """Decoded audio: 16 kHz mono s16le PCM."""

    pcm: bytes
    format: str

    @property
    def duration_s(self) -> float:
        return len(self.pcm) / (SAMPLE_RATE * SAMPLE_BYTES)


def _id3_size(data: bytes) -> int:
    """The bytes an ID3v2 tag at the start of `data` takes (0: none): its 10-byte header,
    its synchsafe size, and a 10-byte footer when its flags say so."""
    if data[:3] != b"ID3" or len(data) < 10 or any(b & 0x80 for b in data[6:10]):
        return 0
    size = data[6] << 21 | data[7] << 14 | data[8] << 7 | data[9]
    return 10 + size + (10 if data[5] & 0x10 else 0)


def sniff(data: bytes, filename: str = "") -> str | None:
    """The container a file is, by its first bytes (the name's extension only breaks ties).
    An ID3 tag (MP3's, but also found before FLAC and AAC) is looked past."""
    tag = _id3_size(data)
    if tag:
        return sniff(data[tag:]) or "mp3"  # padding or frames the mp3 demuxer judges
    head = data[:16]
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return "wav"
    if head[:4] == b"fLaC":
        return "flac"
    if head[:4] == b"OggS":
        return "ogg"
    if head[:4] == b"\x1a\x45\xdf\xa3":  # EBML: WebM (and Matroska)
        return "webm"
    if head[4:8] == b"ftyp":
        return "m4a"
    if len(head) > 1 and head[0] == 0xFF and head[1] & 0xF6 == 0xF0:  # layer bits 00: ADTS
        return "aac"
    if len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:  # an MPEG audio frame
        return "mp3"
    ext = Path(filename).suffix.lower().lstrip(".")
    return ext if ext in FORMATS and not data[:1].isascii() else None


def unsupported(filename: str) -> BadRequest:
    return BadRequest(
        f"Invalid file format of '{filename[:100]}'. Supported formats: {list(FORMATS)}",
        param="file",
        code="invalid_audio",
    )


def too_long(duration_s: float, max_s: float) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"The audio is {duration_s:.0f} s long; at most {max_s:.0f} s can be transcribed per "
        "request. Please split it",
        param="file",
        code="audio_too_long",
    )


async def decode(data: bytes, filename: str, max_s: float) -> Audio:
    """`data` decoded; a 400 for audio that is not one of FORMATS or does not decode, a 413
    for audio longer than `max_s`."""
    fmt = sniff(data, filename)
    if fmt is None:
        raise unsupported(filename)
    if DEMUXERS[fmt] != "mp3" and (tag := _id3_size(data)):
        data = data[tag:]  # a tag before another container: its demuxer may not look past it
    audio = await asyncio.to_thread(read_wav, data, max_s) if fmt == "wav" else None
    if audio is None:
        audio = await _ffmpeg(data, fmt, max_s)
    if not audio.pcm:
        raise BadRequest("The audio file has no samples", param="file", code="invalid_audio")
    if audio.duration_s > max_s:
        raise too_long(audio.duration_s, max_s)
    return audio


def read_wav(data: bytes, max_s: float) -> Audio | None:
    """Integer-PCM WAV through the standard library (None: an encoding only ffmpeg reads)."""
    import numpy as np  # here, not at import: the supervisor starts without it

    try:
        with wave.open(io.BytesIO(data)) as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            frames = w.getnframes()
            if rate <= 0 or channels <= 0 or width not in (1, 2, 3, 4):
                raise wave.Error("no sample rate, no channels or an odd sample width")
            if frames / rate > max_s:  # the header says so: nothing to decode
                raise too_long(frames / rate, max_s)
            raw = w.readframes(frames)
    except MlxdError:
        raise
    except wave.Error as exc:
        if "unknown format" in str(exc):
            return None  # float or WAVE_FORMAT_EXTENSIBLE: ffmpeg reads those
        raise BadRequest(f"Invalid WAV file: {exc}", param="file", code="invalid_audio") from None
    except Exception:  # the standard library on a truncated or mangled file (EOF, Runtime...)
        raise BadRequest(
            "Invalid WAV file: truncated or malformed", param="file", code="invalid_audio"
        ) from None
    n = len(raw) // (width * channels)
    raw = raw[: n * width * channels]
    if width == 1:  # unsigned 8-bit
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 3:  # 24-bit: widen each sample to 32 bits
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3)
        wide = b[:, 0].astype(np.int32) << 8 | b[:, 1].astype(np.int32) << 16
        wide |= b[:, 2].astype(np.int8).astype(np.int32) << 24
        x = wide.astype(np.float32) / 2**31
    else:
        dtype = {2: np.int16, 4: np.int32}[width]
        x = np.frombuffer(raw, dtype).astype(np.float32) / float(2 ** (8 * width - 1))
    x = x.reshape(-1, channels).mean(axis=1)
    if rate != SAMPLE_RATE and len(x):  # linear interpolation onto the 16 kHz grid
        t = np.arange(int(len(x) * SAMPLE_RATE / rate)) * (rate / SAMPLE_RATE)
        x = np.interp(t, np.arange(len(x)), x)
    pcm = (np.clip(x, -1.0, 32767 / 32768) * 32768).astype("<i2").tobytes()
    return Audio(pcm, "wav")


def ffmpeg_path() -> str | None:
    return shutil.which("ffmpeg")


async def _ffmpeg(data: bytes, fmt: str, max_s: float) -> Audio:
    exe = ffmpeg_path()
    if exe is None:
        raise BadRequest(
            f"Decoding {fmt} audio needs ffmpeg, which this server does not have; send WAV, "
            "or install ffmpeg where mlxd runs",
            param="file",
            code="unsupported_audio_format",
        )
    with tempfile.NamedTemporaryFile(prefix="mlxd-audio-", suffix="." + fmt) as f:
        name = f.name
        f.write(data)
        f.flush()
        # One second past the bound tells "too long" from "exactly the bound".
        cmd = [exe, "-nostdin", "-hide_banner", "-loglevel", "error"]
        cmd += ["-protocol_whitelist", "file", "-f", DEMUXERS[fmt]]
        cmd += ["-enable_drefs", "0"] if DEMUXERS[fmt] == "mov" else []  # no external tracks
        cmd += ["-i", f.name]
        cmd += ["-t", f"{max_s + 1:.3f}", "-vn", "-f", "s16le", "-ac", "1", "-ar", "16000", "-"]
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            pcm, err = await asyncio.wait_for(proc.communicate(), DECODE_TIMEOUT_S)
        except asyncio.CancelledError:  # the client left: its decoder goes with it
            proc.kill()
            await proc.wait()
            raise
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise BadRequest(
                f"The {fmt} audio took over {DECODE_TIMEOUT_S:.0f} s to decode",
                param="file",
                code="invalid_audio",
            ) from None
    if proc.returncode != 0:
        why = err.decode(errors="replace").replace(name, "file").strip().splitlines()
        log.info("ffmpeg could not decode %s audio: %s", fmt, why[-1:] or proc.returncode)
        raise BadRequest(
            f"The audio file could not be decoded as {fmt}" + (f": {why[-1][:200]}" if why else ""),
            param="file",
            code="invalid_audio",
        )
    return Audio(pcm[: len(pcm) - len(pcm) % SAMPLE_BYTES], fmt)
