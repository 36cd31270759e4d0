"""Routing by model, on-demand loads, defaults and the model list, through a real daemon."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

MSG = [{"role": "user", "content": "hello"}]


def test_two_models_served_side_by_side(make_daemon):
    d = make_daemon()
    oai = d.openai()
    assert {c["id"]: c["status"] for c in d.http.get("/v1/models").json()["data"]} == {
        "a": "available",
        "b": "available",
    }
    ra = oai.chat.completions.create(model="a", messages=MSG, max_tokens=5, temperature=0)
    rb = oai.chat.completions.create(model="b", messages=MSG, max_tokens=5, temperature=0)
    assert (ra.model, rb.model) == ("a", "b")
    assert ra.usage.completion_tokens == rb.usage.completion_tokens == 5
    assert ra.choices[0].message.content != rb.choices[0].message.content
    assert d.status("a")["status"] == d.status("b")["status"] == "loaded"
    assert len(d.worker_pids()) == 2
    stream = oai.chat.completions.create(
        model="b", messages=MSG, max_tokens=5, temperature=0, stream=True
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in stream) == rb.choices[0].message.content
    )


def test_concurrent_first_requests_cause_one_load(make_daemon):
    d = make_daemon()
    oai = d.openai()
    with ThreadPoolExecutor(6) as pool:
        rs = list(
            pool.map(
                lambda _: oai.chat.completions.create(
                    model="a", messages=MSG, max_tokens=3, temperature=0
                ),
                range(6),
            )
        )
    assert all(r.usage.completion_tokens == 3 for r in rs)
    assert d.logs().count("spawned model=a ") == 1
    assert len(d.worker_pids("a")) == 1


def test_unknown_model_404_in_each_envelope(make_daemon):
    d = make_daemon()
    r = d.http.post("/v1/chat/completions", json={"model": "nope", "messages": MSG})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"
    r = d.http.post("/v1/messages", json={"model": "nope", "messages": MSG, "max_tokens": 5})
    assert r.status_code == 404
    assert r.json() == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "The model 'nope' does not exist"},
    }


def test_missing_model_uses_default_or_is_400(make_daemon):
    d = make_daemon()
    r = d.http.post("/v1/chat/completions", json={"messages": MSG})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    d2 = make_daemon(config='default_model = "b"\n')
    r = d2.http.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 3})
    assert r.status_code == 200 and r.json()["model"] == "b"


def test_bad_bodies_are_4xx(make_daemon):
    d = make_daemon(env={"MLXD_MAX_BODY_BYTES": "4096"})
    assert d.http.post("/v1/chat/completions", content=b"{oops").status_code == 400
    assert d.http.post("/v1/chat/completions", json={"model": 5}).status_code == 400
    big = {"model": "a", "messages": [{"role": "user", "content": "x" * 10000}]}
    r = d.http.post("/v1/chat/completions", json=big)
    assert r.status_code == 413 and r.json()["error"]["message"]
    assert d.http.get("/v1/nothing").status_code == 404
    r = d.http.post("/v1/nothing", json={"model": "a"})  # only known routes are forwarded
    assert r.status_code == 404 and r.json()["error"]["message"]
    assert d.worker_pids("a") == d.worker_pids()  # b was never loaded by the bad requests


def test_request_id_passes_through(make_daemon):
    d = make_daemon()
    r = d.http.post(
        "/v1/chat/completions",
        headers={"x-request-id": "req-abc-123"},
        json={"model": "a", "messages": MSG, "max_tokens": 2},
    )
    assert r.headers["x-request-id"] == "req-abc-123"
    assert "request_id=req-abc-123" in d.logs()
    # The worker's access line is written after the last byte is sent and reaches
    # a.log through the supervisor's log pipe: it lands shortly after the response.
    log = d.home / "logs" / "a.log"
    d.wait_for(lambda: "req-abc-123" in log.read_text(), 10, "the worker's access line")


def test_preloaded_model_starts_with_the_daemon(make_daemon):
    d = make_daemon(config="[models.b]\npreload = true\n")
    d.wait_for(lambda: d.status("b")["status"] == "loaded", 30, "preload of b")
    assert d.status("a")["status"] == "available"


def test_model_retrieve(make_daemon):
    d = make_daemon()
    r = d.http.get("/v1/models/a")
    assert r.status_code == 200 and r.json()["id"] == "a" and r.json()["status"] == "available"
    assert d.http.get("/v1/models/zzz").status_code == 404
