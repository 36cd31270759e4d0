"""The worker as a process: socket hygiene, load failures, graceful SIGTERM."""

from __future__ import annotations

import signal
import stat
import subprocess
import sys
import threading

from mlxd.shared.exit_codes import EXIT_MODEL_LOAD_ERROR

from procs import start_worker, stop, uds_client, uds_openai, wait_rows


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
        [
            sys.executable,
            "-m",
            "mlxd.worker",
            "--model-path",
            str(tmp_path),
            "--model-id",
            "x",
            "--socket",
            str(short_tmp / "bad.sock"),
        ],
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == EXIT_MODEL_LOAD_ERROR
    assert b"cannot load model=x" in proc.stderr


def test_sigterm_lets_the_stream_in_flight_finish(tiny_model_dir, short_tmp):
    sock = short_tmp / "term.sock"
    proc = start_worker(tiny_model_dir, sock)
    oai = uds_openai(sock)
    got = {}

    def run():
        chunks = list(
            oai.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "go"}],
                max_tokens=150,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        got["usage"] = chunks[-1].usage.completion_tokens
        got["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]

    t = threading.Thread(target=run)
    t.start()
    wait_rows(sock)  # admitted: SIGTERM lets it finish, it is not refused
    proc.send_signal(signal.SIGTERM)
    t.join(60)
    assert got == {"usage": 150, "finish": "length"}
    assert proc.wait(30) == 0


def test_drain_finishes_rows_then_refuses_new_ones(tiny_model_dir, short_tmp):
    sock = short_tmp / "drain.sock"
    proc = start_worker(tiny_model_dir, sock)
    oai = uds_openai(sock)
    got = {}

    def run():
        r = oai.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=80, temperature=0
        )
        got["finish"] = r.choices[0].finish_reason

    try:
        t = threading.Thread(target=run)
        t.start()
        wait_rows(sock)  # in the batch before the drain: it finishes, the next is refused
        with uds_client(sock) as c:
            body = c.post("/admin/drain").json()
            assert body["status"] == "drained" and body["cancelled"] == 0
            t.join(30)
            assert got["finish"] == "length"
            r = c.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
            )
            assert r.status_code == 503
            health = c.get("/health")  # unhealthy: routing and the watchdog must see it
            assert health.status_code == 503 and health.json()["status"] == "draining"
    finally:
        assert stop(proc) == 0


def test_drain_deadline_cancels_with_a_clear_error(tiny_model_dir, short_tmp):
    sock = short_tmp / "drain2.sock"
    proc = start_worker(tiny_model_dir, sock, "tiny", "--grace-s", "0.3")
    oai = uds_openai(sock)
    got = {}

    def run():
        try:
            oai.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "x"}],
                max_tokens=3000,
                temperature=0,
            )
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            got["exc"] = exc

    try:
        t = threading.Thread(target=run)
        t.start()
        wait_rows(sock)  # in the batch when the drain's grace runs out: cancelled, not refused
        with uds_client(sock) as c:
            body = c.post("/admin/drain").json()
        t.join(30)
        assert body["cancelled"] == 1
        assert got["exc"].status_code == 503
        assert "unloaded" in str(got["exc"])
    finally:
        stop(proc)
