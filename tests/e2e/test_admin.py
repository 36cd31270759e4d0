"""The /admin API against a real daemon: status, load/unload/drain/reload, flush, stats, logs."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time

import httpx
import psutil
import pytest

MSG = [{"role": "user", "content": "hello"}]


def ask(d, model: str, n: int = 3, client: httpx.Client | None = None) -> httpx.Response:
    return (client or d.http).post(
        "/v1/chat/completions",
        json={"model": model, "messages": MSG, "max_tokens": n, "temperature": 0},
    )


def stream(d, model: str, n: int, started: threading.Event | None = None) -> tuple[int, list[str]]:
    body = {"model": model, "messages": MSG, "max_tokens": n, "temperature": 0, "stream": True}
    lines = []
    with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, timeout=60) as r:
        for ln in r.iter_lines():
            if ln.startswith("data: "):
                lines.append(ln[6:])
                if started is not None and len(lines) == 3:
                    started.set()
        return r.status_code, lines


def row(d, model: str) -> dict:
    return next(m for m in d.http.get("/admin/models").json()["data"] if m["id"] == model)


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_models_list_and_status_fields(make_daemon, tiny_model_dir):
    d = make_daemon(
        models={"a": tiny_model_dir, "org/m": tiny_model_dir},
        config="[models.a]\nkeep_alive_s = 60\n",
    )
    rows = {m["id"]: m for m in d.http.get("/admin/models").json()["data"]}
    assert set(rows) == {"a", "org/m"}
    assert rows["a"]["state"] == "stopped" and rows["a"]["pid"] is None
    assert rows["a"]["source"] == "home" and rows["a"]["weights_bytes"] > 0
    assert ask(d, "a").status_code == 200
    a = row(d, "a")
    assert a["state"] == "ready" and a["pid"] == d.worker_pids("a")[0]
    assert a["memory_bytes"] > 10 << 20  # the RSS of a process that imported MLX
    assert (a["leases"], a["queued"], a["restarts"], a["last_error"]) == (0, 0, 0, None)
    assert a["keep_alive_s"] == 60 and 0 < a["expires_in_s"] <= 60
    assert a["idle_s"] < 30 and a["generation"] == 0 and a["drained"] is False
    assert d.http.get("/admin/models/org/m").json()["state"] == "stopped"
    # The SDK sends the slash encoded (/v1/models/org%2Fm): that is a model id, not a trick.
    assert d.openai().models.retrieve("org/m").id == "org/m"
    # Ids with a slash work on every route; unknown ids and path tricks are 404s.
    r = d.http.post("/admin/models/org/m/load")
    assert r.status_code == 200 and r.json()["result"] == "loaded"
    assert r.json()["model"]["state"] == "ready"
    assert d.http.post("/admin/models/org/m/load").json()["result"] == "already loaded"
    assert d.http.get("/admin/models/org/m/logs", params={"tail": 5}).json()["lines"]
    for path in (
        "/admin/models/nope/load",
        "/admin/models/../../etc/passwd/logs",
        "/admin/models/%2E%2E%2Fa/unload",
        "/admin/models/nope",
    ):
        r = d.http.request("POST" if path.endswith("load") else "GET", path)
        assert r.status_code == (400 if "%2E" in path else 404), path  # dot segments: 400
        assert r.json()["error"]["message"]


def test_load_unload_and_logs(make_daemon):
    d = make_daemon()
    r = d.http.post("/admin/models/a/load")
    assert r.status_code == 200 and r.json()["result"] == "loaded"
    pid = r.json()["model"]["pid"]
    assert d.worker_pids("a") == [pid]

    logs = d.http.get("/admin/models/a/logs", params={"tail": 2}).json()
    assert logs["file"] == "a.log" and len(logs["lines"]) == 2
    assert any(
        "ready model=a" in ln
        for ln in d.http.get("/admin/models/a/logs", params={"tail": 1000}).json()["lines"]
    )
    assert (
        d.http.get("/admin/models/a/logs", params={"after": logs["offset"]}).json()["lines"] == []
    )
    ask(d, "a")
    new = d.http.get("/admin/models/a/logs", params={"after": logs["offset"]}).json()
    assert any("/v1/chat/completions 200" in ln for ln in new["lines"])
    assert new["offset"] > logs["offset"]
    assert d.http.get("/admin/models/a/logs", params={"tail": "x"}).status_code == 400
    assert d.http.get("/admin/models/b/logs").json()["lines"] == []  # never started

    r = d.http.post("/admin/models/a/unload").json()
    assert r["result"] == "unloaded" and r["model"]["state"] == "stopped"
    assert r["drain"]["status"] == "drained"
    assert gone(pid)
    assert d.http.post("/admin/models/a/unload").json()["result"] == "not running"
    assert ask(d, "a").status_code == 200  # an unloaded model loads again on demand


def test_drain_refuses_new_requests_until_loaded(make_daemon):
    d = make_daemon()
    assert ask(d, "a").status_code == 200
    pid = d.worker_pids("a")[0]
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("s", stream(d, "a", 120)))
    t.start()
    d.wait_for(lambda: row(d, "a")["leases"] == 1, 20, "the stream to start")
    result: dict = {}
    drainer = threading.Thread(
        target=lambda: result.setdefault(
            "r", httpx.post(d.url + "/admin/models/a/drain", timeout=60)
        )
    )
    drainer.start()
    d.wait_for(lambda: row(d, "a")["drained"], 10, "the drain to begin")
    r = ask(d, "a")  # refused while the in-flight stream finishes
    assert r.status_code == 503 and "drained" in r.json()["error"]["message"]
    drainer.join(60)
    t.join(60)
    status, lines = out["s"]
    assert status == 200 and lines[-1] == "[DONE]"  # the in-flight stream was not cut
    body = result["r"].json()
    assert body["result"] == "drained" and body["model"]["state"] == "stopped"
    assert body["model"]["drained"] is True and gone(pid)
    assert ask(d, "a").status_code == 503
    assert d.http.post("/admin/models/a/load").json()["result"] == "loaded"
    assert ask(d, "a").status_code == 200


@pytest.mark.slow
def test_hot_reload_under_steady_traffic_fails_nothing(make_daemon):
    d = make_daemon()
    assert ask(d, "a").status_code == 200
    old_pid = d.worker_pids("a")[0]
    stop = threading.Event()
    results: list[tuple] = []

    def plain():
        with httpx.Client(base_url=d.url, timeout=60) as c:
            while not stop.is_set():
                r = ask(d, "a", 4, c)
                results.append(("plain", r.status_code, time.monotonic()))

    def streaming():
        while not stop.is_set():
            status, lines = stream(d, "a", 6)
            results.append(
                ("stream", status if lines[-1:] == ["[DONE]"] else lines, time.monotonic())
            )

    threads = [threading.Thread(target=f) for f in (plain, plain, streaming)]
    for t in threads:
        t.start()
    d.wait_for(lambda: len(results) >= 5, 30, "traffic")
    # A long stream in flight on the old worker when routing switches: the drain waits for it.
    long_out: dict = {}
    started = threading.Event()

    def long_stream():
        long_out["s"] = stream(d, "a", 1000, started)
        long_out["ended"] = time.monotonic()

    long = threading.Thread(target=long_stream)
    long.start()
    assert started.wait(30)
    r = d.http.post("/admin/models/a/reload")
    swapped = time.monotonic()
    d.wait_for(lambda: sum(t > swapped for *_, t in results) >= 10, 30, "traffic after swap")
    stop.set()
    for t in threads:
        t.join(60)
    long.join(60)

    assert r.status_code == 200, r.text
    body = r.json()
    assert body["result"] == "reloaded" and body["model"]["generation"] == 1
    assert body["model"]["pid"] != old_pid and d.worker_pids("a") == [body["model"]["pid"]]
    failures = [x for x in results if x[1] != 200]
    assert not failures, failures
    assert long_out["s"][0] == 200 and long_out["s"][1][-1] == "[DONE]"
    assert '"finish_reason":"length"' in long_out["s"][1][-2]
    assert long_out["ended"] < swapped  # the old worker stopped only after it had finished
    assert gone(old_pid)
    assert d.http.get("/admin/models/a/logs").json()["file"] == "a.g1.log"
    assert d.http.get("/admin/stats").json()["supervisor"]["reloads"] == 1
    assert "hot swap: generation 1 is serving" in d.logs()


def test_reload_resets_a_fatal_model(make_daemon):
    d = make_daemon(env={"MLXD_CRASH_LIMIT": "1"})
    assert ask(d, "a").status_code == 200
    os.kill(d.worker_pids("a")[0], signal.SIGKILL)
    d.wait_for(lambda: row(d, "a")["state"] == "fatal", 10, "FATAL")
    assert "SIGKILL" in row(d, "a")["last_error"]
    assert ask(d, "a").status_code == 503
    r = d.http.post("/admin/models/a/reload").json()
    assert r["result"] == "loaded" and r["model"]["state"] == "ready"
    assert ask(d, "a").status_code == 200
    # A reload of a stopped model just loads it.
    assert d.http.post("/admin/models/b/reload").json()["result"] == "loaded"


def test_flush_and_stats_gather_every_worker(make_daemon):
    d = make_daemon()
    assert d.http.post("/admin/cache/flush").json()["workers"] == {}
    assert ask(d, "a").status_code == 200 and ask(d, "b").status_code == 200
    flush = d.http.post("/admin/cache/flush").json()
    assert set(flush["flushed"]) | set(flush["unsupported"]) == {"a", "b"}
    assert flush["failed"] == []
    st = d.http.get("/admin/stats").json()
    sup = st["supervisor"]
    assert sup["models_loaded"] == 2 and sup["loads"] == 2 and sup["crashes"] == 0
    assert sup["budget_bytes"] > 0 and sup["leases"] == 0
    for m in ("a", "b"):
        w = st["workers"][m]
        assert w["status"] == 200 and w["body"]["model"] == m
        assert w["body"]["prompt_tokens"] > 0 and w["body"]["generation_tokens"] == 3


def test_reload_is_cold_when_two_copies_do_not_fit(make_daemon):
    d = make_daemon(env={"MLXD_MAX_LOADED_MODELS": "1"})
    assert ask(d, "a").status_code == 200
    old_pid = d.worker_pids("a")[0]
    r = d.http.post("/admin/models/a/reload").json()
    assert r["result"] == "reloaded cold" and r["model"]["state"] == "ready"
    assert r["model"]["pid"] != old_pid and r["model"]["generation"] == 0
    assert ask(d, "a").status_code == 200


def test_failed_reload_keeps_the_old_worker_serving(make_daemon):
    d = make_daemon()
    assert ask(d, "a").status_code == 200
    pid = d.worker_pids("a")[0]
    for f in (d.home / "models" / "a").glob("*.safetensors"):
        f.unlink()  # the running worker has its weights; a new one cannot load
    r = d.http.post("/admin/models/a/reload")
    assert r.status_code == 503
    assert "the old worker keeps serving" in r.json()["error"]["message"]
    assert ask(d, "a").status_code == 200 and d.worker_pids("a") == [pid]
    assert row(d, "a")["state"] == "ready" and row(d, "a")["generation"] == 0
    # A running model whose folder is gone can still be seen and unloaded.
    shutil.rmtree(d.home / "models" / "a")
    assert row(d, "a")["source"] is None
    assert d.http.post("/admin/models/a/unload").json()["result"] == "unloaded"
    assert d.http.post("/admin/models/a/load").status_code == 404
