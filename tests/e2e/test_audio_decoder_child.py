"""An upload's ffmpeg child lives no longer than its request: a client that leaves while its
audio is decoding (the request task cancelled) takes the decoder with it."""

from __future__ import annotations

import asyncio
import os
import stat

import psutil
import pytest

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
