"""GET /metrics through prometheus_client's parser, and the JSON log file: a real daemon."""

from __future__ import annotations

import json

import httpx
from prometheus_client.parser import text_string_to_metric_families

MSG = [{"role": "user", "content": "hello"}]


def scrape(d) -> dict[tuple[str, tuple], float]:
    r = d.http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def chat(d, model: str, stream: bool = False, rid: str | None = None) -> None:
    body = {"model": model, "messages": MSG, "max_tokens": 4, "temperature": 0, "stream": stream}
    headers = {"x-request-id": rid} if rid else {}
    with httpx.stream(
        "POST", d.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        assert r.status_code == 200
        assert b"mlxd-first-token" not in r.read()  # the proxy cuts the worker's marker out


def test_metrics_move_as_requests_flow(make_daemon):
    d = make_daemon()
    before = scrape(d)
    assert value(before, "mlxd_models_loaded") == 0
    assert value(before, "mlxd_loads_total") == 0
    chat(d, "a")
    chat(d, "a", stream=True)
    chat(d, "b", stream=True)
    assert d.http.post("/v1/chat/completions", json={"model": "nope"}).status_code == 404
    m = scrape(d)
    chat_route = "/v1/chat/completions"
    assert value(m, "mlxd_requests_total", model="a", route=chat_route, status="200") == 2
    assert value(m, "mlxd_requests_total", model="b", route=chat_route, status="200") == 1
    assert value(m, "mlxd_requests_total", model="", route=chat_route, status="404") == 1
    assert value(m, "mlxd_request_duration_seconds_count", model="a", route=chat_route) == 2
    assert value(m, "mlxd_time_to_first_token_seconds_count", model="a", route=chat_route) == 1
    assert value(m, "mlxd_time_to_first_token_seconds_count", model="b", route=chat_route) == 1
    assert (
        0
        < value(m, "mlxd_time_to_first_token_seconds_sum", model="a", route=chat_route)
        <= value(m, "mlxd_request_duration_seconds_sum", model="a", route=chat_route)
    )
    assert value(m, "mlxd_models_loaded") == 2
    assert value(m, "mlxd_loads_total") == 2
    # The engine's part of the first token, per model: every request got one.
    for name in ("queue_wait", "admitted_to_first_token"):
        assert value(m, f"mlxd_engine_{name}_seconds_count", model="a") == 2
        assert value(m, f"mlxd_engine_{name}_seconds_count", model="b") == 1
    engine_part = value(m, "mlxd_engine_queue_wait_seconds_sum", model="a") + value(
        m, "mlxd_engine_admitted_to_first_token_seconds_sum", model="a"
    )
    assert (
        0
        < engine_part
        <= value(m, "mlxd_request_duration_seconds_sum", model="a", route=chat_route)
    )
    assert value(m, "mlxd_crashes_total") == value(m, "mlxd_evictions_total") == 0
    assert value(m, "mlxd_model_state", model="a", state="ready") == 1
    assert value(m, "mlxd_leases") == value(m, "mlxd_queue_depth") == 0
    assert value(m, "mlxd_worker_rss_bytes", model="a") > 10 << 20
    assert value(m, "mlxd_generation_tokens_total", model="a") == 8
    assert value(m, "mlxd_prompt_tokens_total", model="a") > 0
    # Prompt-cache families exist per model and tier (zero until the worker reports them).
    assert ("mlxd_prompt_cache_hits_total", (("model", "a"), ("tier", "ram"))) in m
    assert ("mlxd_prompt_cache_bytes", (("model", "b"), ("tier", "ssd"))) in m

    chat(d, "a")
    assert d.http.post("/admin/models/b/unload").status_code == 200
    after = scrape(d)
    assert value(after, "mlxd_requests_total", model="a", route=chat_route, status="200") == 3
    assert value(after, "mlxd_generation_tokens_total", model="a") == 12
    assert value(after, "mlxd_unloads_total") == 1 and value(after, "mlxd_models_loaded") == 1
    assert (
        value(
            after,
            "mlxd_requests_total",
            model="b",
            route="/admin/models/{model_id}/unload",
            status="200",
        )
        == 1
    )
    assert value(after, "mlxd_requests_total", model="", route="/metrics", status="200") == 2


def test_first_token_is_timed_on_every_streaming_surface_and_only_there(make_daemon):
    d = make_daemon()
    bodies = {
        "/v1/completions": {"prompt": "hello", "max_tokens": 3},
        "/v1/messages": {"messages": MSG, "max_tokens": 3},
        "/v1/responses": {"input": "hello", "max_output_tokens": 3},
    }
    for route, body in bodies.items():
        for stream in (False, True):
            r = d.http.post(route, json={"model": "a", "stream": stream, "temperature": 0, **body})
            assert r.status_code == 200 and b"mlxd-first-token" not in r.content
    m = scrape(d)
    for route in bodies:
        assert value(m, "mlxd_time_to_first_token_seconds_count", model="a", route=route) == 1
        assert value(m, "mlxd_requests_total", model="a", route=route, status="200") == 2


def test_log_file_is_json_lines_with_request_id_and_model(make_daemon):
    d = make_daemon()
    chat(d, "a", rid="req-json-1")
    chat(d, "a", stream=True, rid="req-json-2")
    records = [json.loads(line) for line in (d.home / "logs" / "mlxd.log").read_text().splitlines()]
    assert all({"ts", "level", "logger", "msg"} <= set(r) for r in records)
    mine = [r for r in records if r.get("request_id") == "req-json-1"]
    assert any(r["msg"].startswith("spawned model=a") for r in mine)  # its load, its id
    assert all(r["model"] == "a" for r in mine if r["logger"] == "mlxd.routes")
    assert any(r.get("request_id") == "req-json-2" and r.get("model") == "a" for r in records)
    # Terminal lines stay readable text and name the request too.
    assert "proxy model=a path=/v1/chat/completions request_id=req-json-1" in d.logs()
    # A worker's exit long after the request that loaded it carries no request id.
    d.http.post("/admin/models/a/unload")
    records = [json.loads(line) for line in (d.home / "logs" / "mlxd.log").read_text().splitlines()]
    stopped = [r for r in records if "to=stopped" in r["msg"]]
    assert stopped and "request_id" not in stopped[-1]


def on_disk(folder) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def test_ssd_write_counters_move_when_the_ssd_is_written(make_daemon):
    d = make_daemon()
    chat(d, "a")  # a unique prompt: it has not earned an SSD write
    m = scrape(d)
    assert value(m, "mlxd_prompt_cache_ssd_written_bytes_total", model="a") == 0
    session = (("model", "a"), ("reason", "session"))
    assert ("mlxd_prompt_cache_ssd_written_entries_total", session) in m

    def written(reason: str) -> float:
        return value(
            scrape(d), "mlxd_prompt_cache_ssd_written_entries_total", model="a", reason=reason
        )

    # A session's entry is written once it has been quiet a moment (write-behind).
    body = {"model": "a", "messages": [{"role": "user", "content": "mine"}], "max_tokens": 4}
    r = d.http.post("/v1/chat/completions", json=body, headers={"x-session-affinity": "s-m"})
    assert r.status_code == 200
    d.wait_for(lambda: written("session") >= 1, 30, "the session entry's write-behind")
    folder = d.home / "cache"
    first = value(scrape(d), "mlxd_prompt_cache_ssd_written_bytes_total", model="a")
    assert first == on_disk(folder) > 0 and written("drain") == 0
    # A flush writes what RAM still holds (the unique prompt); the counters follow.
    assert d.http.post("/admin/cache/flush").status_code == 200
    assert written("drain") == 1
    after = value(scrape(d), "mlxd_prompt_cache_ssd_written_bytes_total", model="a")
    assert after == on_disk(folder) > first
