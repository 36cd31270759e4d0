"""API key, admin token, loopback-only admin, bind refusal, CORS and body limits: real daemons."""

from __future__ import annotations

import socket
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import httpx
import ollama
import pytest

from procs import free_port

MSG = [{"role": "user", "content": "hello"}]
CHAT = {"model": "a", "messages": MSG, "max_tokens": 2, "temperature": 0}
MESSAGES = {"model": "a", "messages": MSG, "max_tokens": 2}
KEY, TOKEN = "sk-test-key", "admin-test-token"


def bearer(v: str) -> dict:
    return {"Authorization": f"Bearer {v}"}


# (method, path, body, headers, expected status); the daemon has MLXD_API_KEY=KEY and
# MLXD_ADMIN_TOKEN=TOKEN and listens on 127.0.0.1.
CASES = [
    ("GET", "/health", None, {}, 200),
    ("GET", "/v1/models", None, {}, 401),
    ("GET", "/v1/models", None, bearer("wrong"), 401),
    ("GET", "/v1/models", None, {"Authorization": f"Basic {KEY}"}, 401),
    ("GET", "/v1/models", None, {"x-api-key": KEY + "x"}, 401),
    ("GET", "/v1/models", None, bearer(KEY), 200),
    ("GET", "/v1/models", None, {"x-api-key": KEY}, 200),
    ("GET", "/v1/models", None, {"authorization": f"bearer {KEY}"}, 200),
    ("GET", "/v1/models/a", None, {}, 401),
    ("POST", "/v1/chat/completions", CHAT, {}, 401),
    ("POST", "/v1/chat/completions", CHAT, bearer(TOKEN), 401),  # the admin token is no key
    ("POST", "/v1/chat/completions", CHAT, bearer(KEY), 200),
    ("POST", "/v1/messages", MESSAGES, {}, 401),
    ("POST", "/v1/nothing/here", {}, {}, 401),  # refused before anything else is looked at
    ("GET", "/admin/models", None, {}, 401),
    ("GET", "/admin/models", None, bearer(KEY), 401),  # the API key is no admin token
    ("GET", "/admin/models", None, {"x-api-key": TOKEN}, 401),  # Bearer only
    ("GET", "/admin/models", None, bearer(TOKEN), 200),
    ("POST", "/admin/models/a/unload", None, {}, 401),
    ("POST", "/admin/models/a/unload", None, bearer(TOKEN), 200),
    ("GET", "/metrics", None, {}, 401),
    ("GET", "/metrics", None, bearer(TOKEN), 200),
]


def call(base: str, method: str, path: str, body, headers) -> httpx.Response:
    return httpx.request(method, base + path, json=body, headers=headers, timeout=60)


def test_auth_table(make_daemon):
    d = make_daemon(env={"MLXD_API_KEY": KEY, "MLXD_ADMIN_TOKEN": TOKEN})
    got = [(m, p, h, call(d.url, m, p, b, h).status_code) for m, p, b, h, _ in CASES]
    assert got == [(m, p, h, want) for m, p, _, h, want in CASES]
    # Refusals use the route's envelope: OpenAI's, and Anthropic's on /v1/messages.
    r = call(d.url, "POST", "/v1/chat/completions", CHAT, {})
    assert r.json()["error"]["type"] == "authentication_error"
    assert "API key" in r.json()["error"]["message"]
    r = call(d.url, "POST", "/v1/messages", MESSAGES, bearer("nope"))
    assert r.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "Invalid API key"},
    }
    # The key never reaches the worker.
    assert KEY not in (d.home / "logs" / "a.log").read_text()


def _non_loopback_ip() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") else ip


def test_public_bind_needs_a_key_and_admin_stays_local(make_daemon):
    d = make_daemon(env={"MLXD_API_KEY": KEY}, args=["--host", "0.0.0.0"])
    assert d.http.get("/admin/models").status_code == 200  # loopback, no admin token set
    assert d.http.get("/v1/models").status_code == 401
    ip = _non_loopback_ip()
    if ip is None:
        pytest.skip("no non-loopback address to test remote clients with")
    remote = f"http://{ip}:{d.port}"
    r = httpx.get(remote + "/admin/models", timeout=10)
    assert r.status_code == 403 and "loopback" in r.json()["error"]["message"]
    assert httpx.get(remote + "/metrics", timeout=10).status_code == 403
    assert httpx.get(remote + "/health", timeout=10).status_code == 200
    assert httpx.get(remote + "/v1/models", headers=bearer(KEY), timeout=10).status_code == 200


def test_public_bind_without_key_is_refused_unless_insecure(make_daemon, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "mlxd.supervisor",
        "start",
        "--home",
        str(tmp_path),
        "--host",
        "0.0.0.0",
        "--port",
        str(free_port()),
    ]
    p = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "MLXD_DISCOVER_HF_CACHE": "false"},
    )
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing to listen on 0.0.0.0" in lines[0]
    assert "MLXD_API_KEY" in lines[0] and "--insecure" in lines[0]
    d = make_daemon(args=["--host", "0.0.0.0", "--insecure"])
    assert d.http.get("/v1/models").status_code == 200


def test_cors_and_body_limit(make_daemon):
    d = make_daemon(
        env={
            "MLXD_API_KEY": KEY,
            "MLXD_MAX_BODY_BYTES": "4096",
            "MLXD_CORS_ORIGINS": '["http://app.example"]',
        }
    )
    pre = {
        "Origin": "http://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    r = httpx.options(d.url + "/v1/chat/completions", headers=pre)  # no key on a preflight
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "http://app.example"
    assert "POST" in r.headers["access-control-allow-methods"]
    assert r.headers["access-control-allow-headers"] == "authorization, content-type"
    r = httpx.options(d.url + "/v1/chat/completions", headers={**pre, "Origin": "http://evil"})
    assert r.status_code >= 400 and "access-control-allow-origin" not in r.headers
    r = httpx.get(d.url + "/v1/models", headers={"Origin": "http://app.example", **bearer(KEY)})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://app.example"
    r = httpx.get(d.url + "/v1/models", headers={"Origin": "http://evil", **bearer(KEY)})
    assert "access-control-allow-origin" not in r.headers
    # A streamed answer gets the header too (it is added before the headers go out).
    with httpx.stream(
        "POST",
        d.url + "/v1/chat/completions",
        timeout=60,
        json={**CHAT, "stream": True},
        headers={"Origin": "http://app.example", **bearer(KEY)},
    ) as r:
        assert r.headers["access-control-allow-origin"] == "http://app.example"
        assert list(r.iter_lines())
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 10000}]}
    r = httpx.post(d.url + "/v1/chat/completions", json=big, headers=bearer(KEY))
    assert r.status_code == 413 and r.json()["error"]["message"]
    r = httpx.post(d.url + "/v1/chat/completions", json=big)  # unauthenticated: 401 first
    assert r.status_code == 401


def test_no_cors_headers_by_default(make_daemon):
    d = make_daemon()
    r = httpx.get(d.url + "/v1/models", headers={"Origin": "http://app.example"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers  # unlisted
    r = httpx.options(
        d.url + "/v1/chat/completions",
        headers={"Origin": "http://app.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in r.headers


def test_an_api_key_cannot_unload_a_model_through_ollama_keep_alive(make_daemon):
    # An admin token is set: /admin/models/a/unload with the API key is 401, and so is the
    # same effect through Ollama's keep_alive; the chat itself is still served.
    d = make_daemon(env={"MLXD_API_KEY": KEY, "MLXD_ADMIN_TOKEN": TOKEN})
    user = ollama.Client(host=d.url, headers=bearer(KEY))
    admin = ollama.Client(host=d.url, headers={"x-api-key": KEY, **bearer(TOKEN)})

    def expires_in() -> timedelta | None:
        loaded = {m.model: m for m in user.ps().models}.get("a:latest")
        return None if loaded is None else loaded.expires_at - datetime.now(timezone.utc)

    hi = [{"role": "user", "content": "hello"}]
    assert user.chat(model="a", messages=hi, options={"num_predict": 2}).done
    pid = d.worker_pids("a")[0]
    for keep_alive in (0, "-0s", "1s"):  # at once, or sooner than keep_alive_s (300 s)
        r = user.chat(model="a", messages=hi, keep_alive=keep_alive, options={"num_predict": 2})
        assert r.done and r.message.content is not None
        left = expires_in()
        assert left is not None and left > timedelta(minutes=4), (keep_alive, left)
    with pytest.raises(ollama.ResponseError) as e:
        user.generate(model="a", keep_alive=0)  # Ollama's "unload" request
    assert e.value.status_code == 403 and "admin token" in e.value.error
    assert expires_in() is not None and d.worker_pids("a") == [pid]  # never unloaded
    # A longer stay is anyone's; the admin token may unload.
    user.chat(model="a", messages=hi, keep_alive="1h", options={"num_predict": 2})
    assert expires_in() > timedelta(minutes=55)
    assert admin.generate(model="a", keep_alive=0).done_reason == "unload"
    assert expires_in() is None


def test_api_keep_alive_unloads_lets_any_key_unload(make_daemon):
    d = make_daemon(
        env={"MLXD_API_KEY": KEY, "MLXD_ADMIN_TOKEN": TOKEN, "MLXD_API_KEEP_ALIVE_UNLOADS": "1"}
    )
    user = ollama.Client(host=d.url, headers=bearer(KEY))
    assert user.generate(model="a").done_reason == "load"
    assert user.generate(model="a", keep_alive=0).done_reason == "unload"
    assert "a:latest" not in {m.model for m in user.ps().models}
