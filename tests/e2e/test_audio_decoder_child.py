"""An upload's ffmpeg child lives no longer than its request: a client that leaves while its
audio is decoding (the request task cancelled) takes the decoder with it."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess

import psutil
import pytest

from mlxd.shared.errors import BadRequest
from mlxd.supervisor.http import audio_decode


def test_a_cancelled_decode_kills_its_ffmpeg(tmp_path, monkeypatch):
    slow = tmp_path / "ffmpeg"
    slow.write_text("#!/bin/sh\nexec sleep 60\n")
    slow.chmod(slow.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(audio_decode, "ffmpeg_path", lambda: str(slow))
    me = psutil.Process(os.getpid())
    # this pytest worker may already have children of other tests (a daemon of a shared
    # fixture): only the new one that runs the stand-in decoder is ours
    before = {p.pid for p in me.children()}

    def decoders() -> list[psutil.Process]:
        out = []
        for p in me.children():
            try:
                if p.pid not in before and "sleep" in " ".join(p.cmdline()) + p.name():
                    out.append(p)
            except psutil.Error:
                continue
        return out

    async def run() -> list[psutil.Process]:
        task = asyncio.create_task(audio_decode._ffmpeg(b"ID3" + b"\0" * 64, "mp3", 10.0))
        for _ in range(200):  # until the child runs
            kids = decoders()
            if kids:
                break
            await asyncio.sleep(0.02)
        assert kids, "the decoder never started"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return kids

    kids = asyncio.run(run())
    gone, alive = psutil.wait_procs(kids, timeout=5)
    assert not alive  # killed and reaped, not left sleeping


needs_ffmpeg = pytest.mark.skipif(audio_decode.ffmpeg_path() is None, reason="no ffmpeg here")


def _encode(tmp_path, ext: str, seconds: float) -> bytes:
    """A sine tone of `seconds` encoded by ffmpeg as `ext`."""
    out = tmp_path / f"tone.{ext}"
    cmd = [audio_decode.ffmpeg_path(), "-nostdin", "-loglevel", "error", "-f", "lavfi"]
    cmd += ["-i", f"sine=frequency=440:duration={seconds}", "-y", str(out)]
    subprocess.run(cmd, check=True)
    return out.read_bytes()


@needs_ffmpeg
@pytest.mark.parametrize("ext", ["mp3", "ogg", "flac", "m4a", "webm", "aac"])
@pytest.mark.parametrize("tagged", [False, True])
def test_each_container_decodes_through_its_named_demuxer(tmp_path, ext, tagged):
    """With an ID3 tag in front too (FLAC and AAC files carry them): a review (2026-12-07)
    found AAC and tagged FLAC refused once the demuxer was named after a sniff that took any
    tag, and any 0xFFF sync, for MP3."""
    data = _encode(tmp_path, ext, 1.5)
    if tagged:
        body = b"TIT2" + (6).to_bytes(4, "big") + b"\0\0\x03tone\0"  # a title frame
        data = b"ID3\x04\0\0" + bytes([0, 0, 0, len(body)]) + body + data
    audio = asyncio.run(audio_decode.decode(data, f"a.{ext}", 60.0))
    assert audio.format == ext and 1.3 < audio.duration_s < 1.7


@needs_ffmpeg
def test_an_upload_that_is_a_playlist_of_local_files_reads_none_of_them(tmp_path):
    """Found by a black-box probe (2026-12-07): an ID3 tag followed by an HLS playlist naming
    a file on the server was decoded as that file (7 s of audio from a 90-byte upload), so a
    client could have had any audio file the daemon can read transcribed back to it."""
    secret = tmp_path / "secret.mp3"
    secret.write_bytes(_encode(tmp_path, "mp3", 7.0))
    playlist = "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:7.0,\n{}\n#EXT-X-ENDLIST\n"
    for body in (playlist.format(secret), f"ffconcat version 1.0\nfile '{secret}'\n"):
        upload = b"ID3\x04\x00\x00\x00\x00\x00\x00" + body.encode()
        with pytest.raises(BadRequest) as err:
            asyncio.run(audio_decode.decode(upload, "evil.mp3", 60.0))
        assert err.value.code == "invalid_audio" and str(tmp_path) not in str(err.value)
