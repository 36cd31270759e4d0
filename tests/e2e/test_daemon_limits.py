"""The daemon's own resources: one daemon per home, a private home, read timeouts, conn caps."""

from __future__ import annotations

import http.client
import os
import select
import socket
import stat
import subprocess
import sys
import time

import httpx
import orjson

from procs import free_port

MSG = [{"role": "user", "content": "hello"}]


def ask(d, model: str = "a") -> httpx.Response:
    return d.http.post(
        "/v1/chat/completions",
        json={"model": model, "messages": MSG, "max_tokens": 3, "temperature": 0},
    )


def raw_conn(d, first: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    if first:
        s.sendall(first)
    return s


def read_all(s: socket.socket, timeout_s: float) -> bytes:
    """Everything the server sends until it closes the connection (or the timeout)."""
    s.settimeout(timeout_s)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def closed_within(s: socket.socket, timeout_s: float) -> bool:
    s.settimeout(timeout_s)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def fresh_http(d) -> None:
    # The fixture's client keeps a pooled connection from its start-up polling; tests that count
    # connections start from none.
    d.http.close()
    d.http = httpx.Client(base_url=d.url, timeout=60)


def test_second_start_on_the_same_home_is_refused_and_the_first_keeps_serving(make_daemon):
    d = make_daemon()
    assert ask(d).status_code == 200  # a worker is up: the second daemon must not adopt it
    workers = d.worker_pids("a")
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxd.supervisor",
            "start",
            "--home",
            str(d.home),
            "--port",
            str(free_port()),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "MLXD_DISCOVER_HF_CACHE": "false"},
    )
    assert second.returncode != 0
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1, second.stderr
    assert f"pid {d.proc.pid}" in lines[0] and "already running" in lines[0]
    assert d.http.get("/health").status_code == 200
    assert ask(d).status_code == 200
    assert d.worker_pids("a") == workers
    assert (d.home / "run" / "mlxd.pid").read_text().strip() == str(d.proc.pid)


def test_fresh_home_is_owner_only(make_daemon):
    d = make_daemon()
    assert ask(d).status_code == 200  # creates the worker's socket, log and cache folder
    home = d.home
    for name in ("cache", "logs", "responses", "run"):  # models/ was made by the fixture
        assert stat.S_IMODE((home / name).stat().st_mode) == 0o700, name
    assert (home / "logs" / "mlxd.log").exists()
    seen = 0
    for name in ("cache", "logs", "responses", "run"):
        for root, dirs, files in os.walk(home / name):
            for entry in [*dirs, *files]:
                m = stat.S_IMODE(os.lstat(os.path.join(root, entry)).st_mode)
                assert m & 0o077 == 0, f"{name}/{entry} is {oct(m)}"
                seen += 1
    assert seen >= 3  # the daemon log, the worker log and the pid file at least


def test_slow_headers_are_cut_while_other_clients_are_served(make_daemon):
    d = make_daemon(env={"MLXD_HEADER_TIMEOUT_S": "1"})
    slow = [raw_conn(d, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ") for _ in range(20)]
    t0 = time.monotonic()
    with httpx.Client(base_url=d.url) as other:  # a normal client meanwhile
        assert other.get("/health").status_code == 200
    assert all(closed_within(s, 5) for s in slow)
    assert time.monotonic() - t0 < 6
    for s in slow:
        s.close()
    # A fresh connection: d.http's pooled one sat idle past the 1 s header timeout, so the
    # daemon may close it just as the client reuses it (a reset that says nothing here).
    assert httpx.get(d.url + "/health").status_code == 200


def test_idle_keep_alive_connection_is_closed_after_the_header_timeout(make_daemon):
    d = make_daemon(env={"MLXD_HEADER_TIMEOUT_S": "1"})
    s = raw_conn(d, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    s.settimeout(5)
    assert s.recv(65536).startswith(b"HTTP/1.1 200")
    assert closed_within(s, 5)
    s.close()


def test_a_response_slower_than_the_header_timeout_is_not_cut(make_daemon):
    # The first request waits for the model to load (longer than the timeout) and then streams.
    d = make_daemon(env={"MLXD_HEADER_TIMEOUT_S": "0.3"})
    body = {"model": "a", "messages": MSG, "max_tokens": 8, "temperature": 0, "stream": True}
    t0 = time.monotonic()
    with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert time.monotonic() - t0 > 0.3
    assert lines[-1] == "data: [DONE]"


def test_stalled_body_gets_408_in_the_envelope(make_daemon):
    d = make_daemon(env={"MLXD_BODY_TIMEOUT_S": "1"})
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{d.port}\r\n"
        "Content-Type: application/json\r\nContent-Length: 500\r\n\r\n"
    ).encode()
    s = raw_conn(d, head + b'{"model": "a", ')
    t0 = time.monotonic()
    reply = read_all(s, 15)  # until the daemon closes the connection
    s.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert time.monotonic() - t0 < 5
    err = orjson.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
    assert err["type"] == "invalid_request_error" and "did not arrive" in err["message"]
    assert ask(d).status_code == 200


def test_connections_over_the_per_client_cap_are_refused_while_held_ones_work(make_daemon):
    d = make_daemon(env={"MLXD_MAX_CONNECTIONS_PER_CLIENT": "4"})
    fresh_http(d)
    held = [raw_conn(d) for _ in range(4)]
    time.sleep(0.2)  # let the daemon accept them all
    over = raw_conn(d)
    reply = read_all(over, 5)
    over.close()
    assert reply.startswith(b"HTTP/1.1 429"), reply[:200]
    assert orjson.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "too_many_connections"
    # The held connections still work.
    for s in held:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        s.settimeout(5)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
    # Closing one frees its place.
    held.pop().close()
    time.sleep(0.2)
    assert d.http.get("/health").status_code == 200
    for s in held:
        s.close()


def test_many_slow_connections_lock_a_new_client_out_for_at_most_the_header_timeout(make_daemon):
    # More slow sockets than macOS's default descriptor limit of 256; past the per-client cap
    # they are refused at once, and the held ones are cut at the header timeout.
    d = make_daemon(env={"MLXD_MAX_CONNECTIONS_PER_CLIENT": "200", "MLXD_HEADER_TIMEOUT_S": "2"})
    fresh_http(d)
    slow = [raw_conn(d, b"GET /health HTTP/1.1\r\n") for _ in range(300)]
    try:
        t0 = time.monotonic()
        d.wait_for(lambda: _health_ok(d), 10, "a new client served")
        assert time.monotonic() - t0 < 8
    finally:
        for s in slow:
            s.close()


def _health_ok(d) -> bool:
    try:
        return d.http.get("/health").status_code == 200
    except httpx.HTTPError:
        return False


def test_a_header_line_too_long_is_400_and_one_log_line_without_a_traceback(make_daemon):
    d = make_daemon()
    for _ in range(3):
        s = raw_conn(
            d, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 8300 + b"\r\n\r\n"
        )
        assert read_all(s, 10).split(b" ", 2)[1] == b"400"  # aiohttp refuses the header
        s.close()
    assert d.http.get("/health").status_code == 200
    log = (d.home / "logs" / "mlxd.log").read_text(errors="replace")
    assert "Traceback" not in log and "LineTooLong" not in log
    assert log.count("bad request 400 from 127.0.0.1") == 3


def _slow_body(d) -> socket.socket:
    """A connection whose request head is complete and whose body trickles in."""
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{d.port}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    ).encode()
    return raw_conn(d, head + b'{"model": "a", ')


def test_over_the_connection_cap_a_client_reads_a_429_not_a_reset(make_daemon):
    d = make_daemon(env={"MLXD_MAX_CONNECTIONS_PER_CLIENT": "4"})
    fresh_http(d)
    held = [_slow_body(d) for _ in range(4)]
    time.sleep(0.3)  # let the daemon accept them all
    try:
        for size in (10, 200_000, 4_000_000):
            # http.client (urllib's, requests') sends the whole request before it reads: a
            # refusal that closed at once reset it mid-body ("broken pipe"), never read.
            body = orjson.dumps({"model": "a", "messages": MSG, "pad": "x" * size})
            c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
            c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            assert r.status == 429, size
            assert int(r.getheader("Retry-After")) >= 1
            assert orjson.loads(r.read())["error"]["code"] == "too_many_connections"
            c.close()
    finally:
        for s in held:
            s.close()


def test_slow_bodies_holding_the_cap_are_cut_at_the_header_timeout(make_daemon):
    # Crowded (a client holds 3/4 of its cap), a body gets the header timeout (2 s here), not
    # the body timeout (60 s): a program trickling bodies cannot keep other local clients out.
    d = make_daemon(env={"MLXD_MAX_CONNECTIONS_PER_CLIENT": "4", "MLXD_HEADER_TIMEOUT_S": "2"})
    fresh_http(d)
    held = [_slow_body(d) for _ in range(4)]
    try:
        answered, _, _ = select.select(held, [], [], 30)  # the first cut, long before 60 s
        assert answered
        for s in answered:
            reply = read_all(s, 10)
            assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
            message = orjson.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["message"]
            assert "within 2 s (the server is near its connection limit)" in message
        assert ask(d).status_code == 200  # another client gets a place
    finally:
        for s in held:
            s.close()
    # Uncrowded, a slow body still gets the whole body timeout: one slow body is not cut at 2 s.
    one = _slow_body(d)
    assert not closed_within(one, 4)
    one.close()
