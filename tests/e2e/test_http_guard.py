"""What a request may reach on a real daemon: known routes, our Host and Origin, JSON bodies."""

from __future__ import annotations

import gzip
import socket

import httpx
import orjson

MSG = [{"role": "user", "content": "hello"}]
CHAT = {"model": "a", "messages": MSG, "max_tokens": 2, "temperature": 0}


def raw(d, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, dict]:
    """Send the request line exactly as written (an HTTP client would normalize the path)."""
    h = {
        "Host": f"127.0.0.1:{d.port}",
        "Content-Length": str(len(body)),
        "Connection": "close",
        **headers,
    }
    head = "".join(f"{k}: {v}\r\n" for k, v in h.items())
    with socket.create_connection(("127.0.0.1", d.port), timeout=60) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\n{head}\r\n".encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), orjson.loads(rest.partition(b"\r\n\r\n")[2])


def row(d, model: str) -> dict:
    return next(m for m in d.http.get("/admin/models").json()["data"] if m["id"] == model)


def test_dot_segments_never_reach_the_worker(make_daemon):
    d = make_daemon()
    r = d.http.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200, (r.text, d.logs()[-3000:])
    pid = row(d, "a")["pid"]
    body = orjson.dumps({"model": "a"})
    for path in (
        "/v1/%2e%2e/admin/drain",
        "/v1/%2E%2E/admin/drain",
        "/v1/../admin/drain",
        "/v1/chat/completions/%2e%2e/%2e%2e/admin/drain",
        "/v1/..%2fadmin/drain",
        "/v1/%2e%2e%5cadmin%5cdrain",
    ):
        for ctype in ("text/plain", "application/json"):
            status, err = raw(d, "POST", path, {"Content-Type": ctype}, body)
            assert status == 400, (path, ctype, status)
            assert err["error"]["type"] == "invalid_request_error"
    # The worker was never asked: the same process answers, not drained, no restart.
    r = d.http.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] is not None
    a = row(d, "a")
    assert (a["state"], a["drained"], a["pid"], a["restarts"]) == ("ready", False, pid, 0)
    # Query strings still travel with a known route.
    assert d.http.post("/v1/chat/completions?trace=1", json=CHAT).status_code == 200


def test_host_origin_type_and_encoding_refusals(make_daemon):
    d = make_daemon(
        env={"MLXD_CORS_ORIGINS": '["http://app.example"]', "MLXD_ALLOWED_HOSTS": '["box.lan"]'}
    )
    # Unknown /v1 paths: 404 naming the path, and no model is loaded for them.
    r = d.http.post("/v1/foo", json={"model": "a"})
    assert r.status_code == 404 and "/v1/foo" in r.json()["error"]["message"]
    r = d.http.get("/v1/foo/bar")
    assert r.status_code == 404 and "/v1/foo/bar" in r.json()["error"]["message"]
    # DNS rebinding: a name we do not serve is refused on every route, /health included.
    for path in ("/health", "/v1/models", "/admin/models"):
        r = d.http.get(path, headers={"Host": f"attacker.example:{d.port}"})
        assert r.status_code == 403 and "allowed_hosts" in r.json()["error"]["message"]
    assert d.http.get("/v1/models", headers={"Host": f"box.lan:{d.port}"}).status_code == 200
    assert d.http.get("/v1/models", headers={"Host": f"localhost:{d.port}"}).status_code == 200
    # Another site's page: refused, and /admin refuses even an origin cors_origins lists.
    evil = {"Origin": "http://evil.example"}
    assert d.http.get("/v1/models", headers=evil).status_code == 403
    for origin in ("http://evil.example", "http://app.example", "http://localhost:3000"):
        r = d.http.get("/admin/models", headers={"Origin": origin})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        r = d.http.post("/admin/models/a/load", headers={"Origin": origin})
        assert r.status_code == 403
    assert d.http.get("/metrics", headers={"Origin": "http://app.example"}).status_code == 403
    r = d.http.get("/admin/models", headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    own = {"Origin": f"http://127.0.0.1:{d.port}"}
    assert d.http.get("/admin/models", headers=own).status_code == 200
    r = d.http.get("/v1/models", headers={"Origin": "http://app.example"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.example"
    # Bodies a page could send without a preflight: 415 in each surface's envelope.
    text = {"Content-Type": "text/plain"}
    r = d.http.post("/v1/chat/completions", content=orjson.dumps(CHAT), headers=text)
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]
    r = d.http.post("/v1/messages", content=orjson.dumps({**CHAT, "max_tokens": 2}), headers=text)
    assert r.status_code == 415 and r.json()["type"] == "error"
    r = d.http.post("/v1/responses", content=b'{"model": "a", "input": "hi"}', headers=text)
    assert r.status_code == 415
    r = d.http.post("/admin/cache/session/close", content=b'{"session_id": "s"}', headers=text)
    assert r.status_code == 415
    form = {"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://app.example"}
    assert (
        d.http.post("/v1/chat/completions", content=orjson.dumps(CHAT), headers=form).status_code
        == 415
    )
    # A body that does not decode: 400 in the envelope, not a 500.
    r = d.http.post(
        "/v1/chat/completions",
        content=b"not gzip at all",
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert r.status_code == 400 and "Content-Encoding" in r.json()["error"]["message"]
    r = d.http.post(
        "/v1/chat/completions",
        content=b"\x00\x01 not deflate",
        headers={"Content-Encoding": "deflate"},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    # None of that started a worker.
    assert row(d, "a")["state"] == "stopped" and d.worker_pids() == []
    # A good gzip body is decoded once, here; the worker gets plain JSON and answers.
    r = d.http.post(
        "/v1/chat/completions",
        content=gzip.compress(orjson.dumps(CHAT)),
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    # curl's `-d` default type, with no Origin, still works.
    r = d.http.post(
        "/v1/chat/completions",
        content=orjson.dumps(CHAT),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 200


def test_insecure_network_bind_logs_a_warning(make_daemon):
    d = make_daemon(models={}, args=["--host", "0.0.0.0", "--insecure"])
    logs = (d.home / "logs" / "mlxd.log").read_text() + d.logs()
    line = next(ln for ln in logs.splitlines() if "without an API key" in ln)
    assert "WARNING" in line and "0.0.0.0" in line
    assert httpx.get(d.url + "/health", timeout=10).status_code == 200
