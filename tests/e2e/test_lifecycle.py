"""Keep-alive, eviction under a budget, crashes, FATAL, and clean shutdowns: real processes."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import psutil
import pytest

from procs import TIGHT_KV_ALLOWANCE, estimate_bytes, wait_rows

MSG = [{"role": "user", "content": "hello"}]


def ask(d, model: str, n: int = 3) -> httpx.Response:
    return d.http.post(
        "/v1/chat/completions",
        json={"model": model, "messages": MSG, "max_tokens": n, "temperature": 0},
    )


def stream_lines(d, model: str, n: int, out: dict, started: threading.Event | None = None):
    """Stream a chat completion, recording the raw SSE data lines and when it ended."""
    body = {"model": model, "messages": MSG, "max_tokens": n, "temperature": 0, "stream": True}
    lines = []
    try:
        with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, timeout=60) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                    if started is not None and len(lines) == 3:
                        started.set()
    except httpx.HTTPError as exc:
        out["exc"] = exc
    out["lines"] = lines
    out["ended"] = time.monotonic()


def test_keep_alive_unloads_idle_model(make_daemon):
    d = make_daemon(config="[models.a]\nkeep_alive_s = 1\n[models.b]\nkeep_alive_s = -1\n")
    assert ask(d, "a").status_code == 200
    pid_a = d.worker_pids("a")[0]
    assert ask(d, "b").status_code == 200
    d.wait_for(lambda: d.status("a")["status"] == "available", 15, "keep-alive unload of a")
    assert not psutil.pid_exists(pid_a) or psutil.Process(pid_a).status() == "zombie"
    time.sleep(1.5)
    assert d.status("b")["status"] == "loaded"
    assert ask(d, "a").status_code == 200  # loads again on demand


def test_keep_alive_zero_unloads_at_once(make_daemon):
    d = make_daemon(config="keep_alive_s = 0\n")
    assert ask(d, "a").status_code == 200
    d.wait_for(lambda: d.status("a")["status"] == "available", 10, "immediate unload")


def test_eviction_takes_idle_lru_never_busy(make_daemon, tiny_model_dir, reported_bytes):
    # Three copies of the tiny model; the budget holds two of them: a loaded one counts at
    # what its worker reports, the one loading at its estimate.
    held = reported_bytes[tiny_model_dir]
    loading = estimate_bytes(tiny_model_dir, TIGHT_KV_ALLOWANCE)
    d = make_daemon(
        models={"a": tiny_model_dir, "b": tiny_model_dir, "c": tiny_model_dir},
        env={
            "MLXD_MEMORY_BUDGET_BYTES": str(held + loading + held // 2),
            "MLXD_KV_ALLOWANCE_BYTES": str(TIGHT_KV_ALLOWANCE),
        },
    )
    assert ask(d, "a").status_code == 200
    time.sleep(0.05)
    assert ask(d, "b").status_code == 200
    # a is least recently used and idle: loading c evicts a.
    assert ask(d, "c").status_code == 200
    assert (d.status("a")["status"], d.status("b")["status"], d.status("c")["status"]) == (
        "available",
        "loaded",
        "loaded",
    )
    # Make b busy with a long stream and c the LRU: loading a must take c, not b.
    out, started = {}, threading.Event()
    t = threading.Thread(target=stream_lines, args=(d, "b", 300, out, started))
    time.sleep(0.05)
    assert ask(d, "c").status_code == 200
    t.start()
    assert started.wait(30)
    time.sleep(0.05)
    assert ask(d, "b", 1).status_code == 200  # b is the most recently used and busy
    assert ask(d, "a").status_code == 200
    t.join(60)
    assert out["lines"][-1] == "[DONE]"
    assert d.status("b")["status"] == "loaded"
    assert d.status("c")["status"] == "available"


def test_busy_models_make_the_load_wait(make_daemon, tiny_model_dir, reported_bytes):
    # The budget holds one: b's estimate, and half of what a's worker reports beside it.
    held = reported_bytes[tiny_model_dir]
    loading = estimate_bytes(tiny_model_dir, TIGHT_KV_ALLOWANCE)
    d = make_daemon(
        models={"a": tiny_model_dir, "b": tiny_model_dir},
        env={
            "MLXD_MEMORY_BUDGET_BYTES": str(loading + held // 2),
            "MLXD_KV_ALLOWANCE_BYTES": str(TIGHT_KV_ALLOWANCE),
        },
    )
    out, started = {}, threading.Event()
    t = threading.Thread(target=stream_lines, args=(d, "a", 200, out, started))
    t.start()
    assert started.wait(30)
    r = ask(d, "b")  # waits for a's stream to end, then evicts a
    done_b = time.monotonic()
    t.join(60)
    assert r.status_code == 200
    assert out["lines"][-1] == "[DONE]"
    assert done_b >= out["ended"]


def test_model_larger_than_budget_is_503(make_daemon):
    d = make_daemon(env={"MLXD_MEMORY_BUDGET_BYTES": "1000"})
    r = ask(d, "a")
    assert r.status_code == 503 and "does not fit" in r.json()["error"]["message"]


def test_worker_crash_mid_stream_spares_other_model(make_daemon):
    d = make_daemon()
    assert ask(d, "a").status_code == 200 and ask(d, "b").status_code == 200
    out_a, out_b, started = {}, {}, threading.Event()
    ta = threading.Thread(target=stream_lines, args=(d, "a", 400, out_a, started))
    tb = threading.Thread(target=stream_lines, args=(d, "b", 120, out_b))
    ta.start()
    tb.start()
    assert started.wait(30)
    os.kill(d.worker_pids("a")[0], signal.SIGKILL)
    killed = time.monotonic()
    ta.join(30)
    tb.join(60)
    assert out_a["ended"] - killed < 2.0
    assert '"error"' in out_a["lines"][-2] and out_a["lines"][-1] == "[DONE]"  # and the end
    assert out_b["lines"][-1] == "[DONE]"
    assert '"finish_reason":"length"' in out_b["lines"][-2]
    # The next request restarts it (after a 1 s backoff).
    assert ask(d, "a").status_code == 200
    assert "worker died" in d.logs()


def test_plain_request_to_a_dying_worker_is_502(make_daemon):
    d = make_daemon()
    assert ask(d, "a").status_code == 200
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("r", ask(d, "a", 400)))
    t.start()
    wait_rows(d.home / "run" / "a.sock")  # reached the worker, and decoding: killed mid-row
    os.kill(d.worker_pids("a")[0], signal.SIGKILL)
    t.join(30)
    r = result["r"]
    assert r.status_code == 502 and r.json()["error"]["message"]
    assert "waiting for its restart" not in d.logs()  # it may have died of it: never re-sent


def test_crash_loop_becomes_fatal(make_daemon):
    d = make_daemon(env={"MLXD_CRASH_LIMIT": "2", "MLXD_BACKOFF_INITIAL_S": "0.1"})
    for _ in range(2):
        assert ask(d, "a").status_code == 200
        os.kill(d.worker_pids("a")[0], signal.SIGKILL)
        d.wait_for(lambda: d.status("a")["status"] == "failed", 10, "crash noticed")
    r = ask(d, "a")
    assert r.status_code == 503 and "FATAL" in r.json()["error"]["message"]
    assert "SIGKILL" in d.http.get("/admin/models/a").json()["last_error"]  # details: /admin
    assert "SIGKILL" not in d.status("a")["error"]  # /v1 clients get a sentence
    assert ask(d, "b").status_code == 200  # the other model is untouched


def test_model_that_cannot_load_says_why(make_daemon, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    d = make_daemon(models={"broken": broken})
    r = ask(d, "broken")
    assert r.status_code == 503
    assert "exit code 3" in r.json()["error"]["message"]
    card = d.status("broken")
    assert card["status"] == "failed" and "No safetensors found" not in card["error"]
    assert "No safetensors found" in d.http.get("/admin/models/broken").json()["last_error"]


def test_sigterm_finishes_stream_then_exits_zero(make_daemon):
    d = make_daemon()
    assert ask(d, "a").status_code == 200
    out, started = {}, threading.Event()
    t = threading.Thread(target=stream_lines, args=(d, "a", 150, out, started))
    t.start()
    assert started.wait(30)
    d.proc.send_signal(signal.SIGTERM)
    t.join(60)
    assert out["lines"][-1] == "[DONE]"
    assert d.proc.wait(60) == 0
    assert not list((d.home / "run").glob("*.sock"))
    assert d.worker_pids() == []


@pytest.mark.timeout(60)
def test_kill_9_of_supervisor_leaves_no_worker(make_daemon):
    d = make_daemon()
    assert ask(d, "a").status_code == 200 and ask(d, "b").status_code == 200
    pids = d.worker_pids()
    assert len(pids) == 2
    d.proc.kill()
    d.proc.wait()

    def gone():
        return not any(
            psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids
        )

    d.wait_for(gone, 10, "orphan workers to exit")


def test_watchdog_kills_a_silent_worker(make_daemon):
    d = make_daemon(env={"MLXD_HEALTH_INTERVAL_S": "0.3", "MLXD_WATCHDOG_TIMEOUT_S": "1.5"})
    assert ask(d, "a").status_code == 200
    pid = d.worker_pids("a")[0]
    os.kill(pid, signal.SIGSTOP)  # alive but silent
    d.wait_for(lambda: d.status("a")["status"] == "failed", 15, "watchdog kill")
    assert "watchdog" in d.logs()
    assert ask(d, "a").status_code == 200
    assert d.worker_pids("a") != [pid]
