"""The worker as a process: socket hygiene, load failures, graceful SIGTERM."""

from __future__ import annotations

import signal
import stat
import subprocess
import sys
import threading
import time

from mlxd.shared.exit_codes import EXIT_MODEL_LOAD_ERROR

from procs import start_worker, stop, uds_openai


def test_stale_socket_is_replaced_and_mode_is_0600(tiny_model_dir, short_tmp):
    sock = short_tmp / "stale.sock"
    sock.write_text("left over by a crash")
    proc = start_worker(tiny_model_dir, sock)
    try:
        assert stat.S_ISSOCK(sock.stat().st_mode)
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    finally:
        assert stop(proc) == 0
    assert not sock.exists()


def test_unloadable_model_exits_with_load_error(tmp_path, short_tmp):
    (tmp_path / "config.json").write_text('{"model_type": "no-such-arch"}')
    proc = subprocess.run(
        [sys.executable, "-m", "mlxd.worker", "--model-path", str(tmp_path), "--model-id", "x",
         "--socket", str(short_tmp / "bad.sock")], capture_output=True, timeout=60)
    assert proc.returncode == EXIT_MODEL_LOAD_ERROR
    assert b"cannot load model=x" in proc.stderr


def test_sigterm_lets_the_stream_in_flight_finish(tiny_model_dir, short_tmp):
    sock = short_tmp / "term.sock"
    proc = start_worker(tiny_model_dir, sock)
    oai = uds_openai(sock)
    got = {}

    def run():
        chunks = list(oai.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "go"}], max_tokens=150,
            temperature=0, stream=True, stream_options={"include_usage": True}))
        got["usage"] = chunks[-1].usage.completion_tokens
        got["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    t.join(60)
    assert got == {"usage": 150, "finish": "length"}
    assert proc.wait(30) == 0
