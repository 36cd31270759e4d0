"""Issue 11's lifecycle defects against real daemons: eviction fairness, queue timeouts with
Retry-After, worker identity on /health, and a worker drained behind the supervisor's back."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import psutil
import pytest

from procs import TIGHT_KV_ALLOWANCE, estimate_bytes, uds_client

MSG = [{"role": "user", "content": "hello"}]


def ask(d, model: str, n: int = 2, timeout_s: float = 120) -> httpx.Response:
    return httpx.post(
        d.url + "/v1/chat/completions",
        timeout=timeout_s,
        json={"model": model, "messages": MSG, "max_tokens": n, "temperature": 0},
    )


def wait_until_exited(pid: int, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.005)
    raise AssertionError(f"pid {pid} still running")


def budget_for_one(reported_bytes: dict, *dirs) -> int:
    """A budget that holds either model but never one beside the other: the larger estimate
    (a model loading counts at it), plus half of the smaller worker's report (a loaded model
    counts at it). Daemons with it use TIGHT_KV_ALLOWANCE, so every worker's share holds rows."""
    est = [estimate_bytes(d, TIGHT_KV_ALLOWANCE) for d in dirs]
    return max(est) + min(reported_bytes[d] for d in dirs) // 2


@pytest.mark.slow
def test_two_busy_models_in_a_budget_for_one_both_get_served(
    make_daemon, tiny_model_dir, tiny_model_dir_b, reported_bytes
):
    budget = budget_for_one(reported_bytes, tiny_model_dir, tiny_model_dir_b)
    queue_timeout_s = 15.0
    d = make_daemon(
        env={
            "MLXD_MEMORY_BUDGET_BYTES": str(budget),
            "MLXD_KV_ALLOWANCE_BYTES": str(TIGHT_KV_ALLOWANCE),
            "MLXD_QUEUE_TIMEOUT_S": str(queue_timeout_s),
            "MLXD_KEEP_ALIVE_S": "-1",
        }
    )
    results: list[tuple[str, int, str | None, float]] = []
    stop_at = time.monotonic() + 25.0

    def client(model: str):
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            r = ask(d, model)
            results.append(
                (model, r.status_code, r.headers.get("retry-after"), time.monotonic() - t0)
            )
            if r.status_code == 503:
                assert r.json()["error"]["message"]  # the OpenAI envelope

    threads = [threading.Thread(target=client, args=(m,)) for m in ("a", "b") for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)

    bad = [x for x in results if x[1] not in (200, 503) or (x[1] == 503 and not x[2])]
    assert not bad, bad
    served = {m: sum(1 for x in results if x[0] == m and x[1] == 200) for m in ("a", "b")}
    assert served["a"] > 0 and served["b"] > 0, (served, d.logs()[-3000:])
    # Waiting in the queue is bounded by queue_timeout_s; a model's own start comes on top.
    slowest = max(x[3] for x in results)
    assert slowest < queue_timeout_s + 20, slowest
    # A normal request still works afterwards.
    assert ask(d, "a").status_code == 200


def test_worker_health_carries_its_identity(make_daemon):
    d = make_daemon()
    assert ask(d, "a").status_code == 200
    with uds_client(d.home / "run" / "a.sock", 10) as c:
        health = c.get("/health").json()
    memory = {k: health.pop(k) for k in ("memory_in_use_bytes", "memory_limit_bytes")}
    parts = health.pop("memory")  # the one definition of its memory (shared/wire/memory.py)
    assert health == {"status": "ok", "pid": d.worker_pids("a")[0], "generation": 0, "model": "a"}
    assert all(isinstance(v, int) and v > 0 for v in memory.values())  # the memory plan's report
    assert memory["memory_in_use_bytes"] < memory["memory_limit_bytes"]
    assert parts["total_bytes"] == memory["memory_in_use_bytes"] >= parts["weights_bytes"] > 0
    assert d.http.post("/admin/models/a/reload").status_code == 200
    with uds_client(d.home / "run" / "a.g1.sock", 10) as c:
        health = c.get("/health").json()
    assert health["generation"] == 1 and health["pid"] == d.worker_pids("a")[0]


def test_a_worker_drained_behind_the_supervisors_back_is_restarted(make_daemon):
    d = make_daemon(env={"MLXD_HEALTH_INTERVAL_S": "0.5"})
    assert ask(d, "a").status_code == 200
    old_pid = d.worker_pids("a")[0]
    with uds_client(d.home / "run" / "a.sock", 60) as c:
        assert c.post("/admin/drain").status_code == 200
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "draining"
    d.wait_for(lambda: "reports draining; restarting it" in d.logs(), 20, "the watchdog")
    # The next request waits for the restart instead of getting the drained worker's 503.
    assert ask(d, "a").status_code == 200
    assert d.worker_pids("a") and d.worker_pids("a")[0] != old_pid
    # The supervisor's own drain is not a fault: no restart, no crash.
    assert d.http.post("/admin/models/b/load").status_code == 200
    assert d.http.post("/admin/models/b/unload").json()["result"] == "unloaded"
    time.sleep(1.5)
    assert "model=b" not in "\n".join(x for x in d.logs().splitlines() if "watchdog" in x)


def test_queue_timeout_answers_503_with_retry_after(
    make_daemon, tiny_model_dir, tiny_model_dir_b, reported_bytes
):
    budget = budget_for_one(reported_bytes, tiny_model_dir, tiny_model_dir_b)
    d = make_daemon(
        env={
            "MLXD_MEMORY_BUDGET_BYTES": str(budget),
            "MLXD_KV_ALLOWANCE_BYTES": str(TIGHT_KV_ALLOWANCE),
            "MLXD_QUEUE_TIMEOUT_S": "2",
        }
    )
    assert ask(d, "a").status_code == 200
    started, out = threading.Event(), {}

    def long_stream():  # holds a's lease well past the queue timeout
        body = {"model": "a", "messages": MSG, "max_tokens": 4000, "temperature": 0, "stream": True}
        with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, timeout=120) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i == 3:
                    started.set()
                    t0 = time.monotonic()
                    out["b"] = ask(d, "b")
                    out["b_s"] = time.monotonic() - t0
                    break

    t = threading.Thread(target=long_stream)
    t.start()
    assert started.wait(60)
    t.join(120)
    r = out["b"]
    assert r.status_code == 503, r.text
    assert int(r.headers["retry-after"]) >= 1
    assert "queue_timeout_s" in r.json()["error"]["message"]
    assert 1.5 <= out["b_s"] < 10
    assert ask(d, "b").status_code == 200  # once a is idle, b loads


def test_a_request_right_after_a_crash_waits_for_the_restart(make_daemon):
    d = make_daemon()
    assert ask(d, "a").status_code == 200
    old = d.worker_pids("a")[0]
    os.kill(old, signal.SIGKILL)
    # Sent once the worker has died (the kill is not instant on a busy host) but before the
    # supervisor's reaper noticed: a refused socket, or a pooled connection to a zombie.
    wait_until_exited(old)
    r = ask(d, "a")
    assert r.status_code == 200, r.text
    assert d.worker_pids("a") and d.worker_pids("a")[0] != old
    assert "waiting for its restart" in d.logs() or "worker died" in d.logs()
    assert "/run/" not in r.text


def test_a_request_right_after_a_busy_workers_crash_waits_for_the_restart(make_daemon):
    # A busy worker killed with -9 can take a while to die (a large process tears down its
    # memory), and meanwhile its socket still takes connections: a request sent then reaches
    # a process that will never read it. Stopped (SIGSTOP), the worker is held in exactly that
    # state. That request must wait for the restart instead of getting a 502; the stream the
    # worker was serving still ends with its error event.
    d = make_daemon()
    assert ask(d, "a").status_code == 200
    old = d.worker_pids("a")[0]
    started, out = threading.Event(), {}

    def long_stream():
        body = {"model": "a", "messages": MSG, "max_tokens": 4000, "temperature": 0, "stream": True}
        lines = []
        with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                    if len(lines) == 3:
                        started.set()
        out["lines"] = lines

    t = threading.Thread(target=long_stream)
    t.start()
    assert started.wait(60)
    os.kill(old, signal.SIGSTOP)
    sent = threading.Thread(target=lambda: out.setdefault("r", ask(d, "a")))
    sent.start()
    time.sleep(0.5)  # the request reaches the stopped worker's socket
    os.kill(old, signal.SIGKILL)
    sent.join(120)
    t.join(60)
    r = out["r"]
    assert r.status_code == 200, r.text
    assert d.worker_pids("a") and d.worker_pids("a")[0] != old
    # the stream on the dead worker ended with its error event, then the terminator
    assert '"error"' in out["lines"][-2] and out["lines"][-1] == "[DONE]"
    assert "worker died before the request reached it; waiting for its restart" in d.logs()
    # As users meet it: kill -9 mid-stream, a request 50 ms later.
    started.clear()
    t = threading.Thread(target=long_stream)
    t.start()
    assert started.wait(60)
    busy = d.worker_pids("a")[0]
    os.kill(busy, signal.SIGKILL)
    time.sleep(0.05)
    r = ask(d, "a")
    t.join(60)
    assert r.status_code == 200, r.text
    assert d.worker_pids("a")[0] != busy
    assert '"error"' in out["lines"][-2] and out["lines"][-1] == "[DONE]"
