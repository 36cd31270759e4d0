"""The supervisor's request guard: raw paths, Host, Origin, Content-Type (no processes, no MLX)."""

from __future__ import annotations

import asyncio
import gzip
import logging

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from mlxd.shared.config import Settings
from mlxd.shared.middleware import error_middleware
from mlxd.supervisor.http.auth import auth_middleware, insecure_warning
from mlxd.supervisor.http.cors import add_cors, cors_middleware
from mlxd.supervisor.http.guard import (
    content_type_refusal,
    guard_middleware,
    host_allowed,
    host_name,
    origin_allowed,
    path_refusal,
)

PORT = 8080
FORM_CT = "application/x-www-form-urlencoded"


def settings(**kw) -> Settings:
    return Settings(**{"host": "127.0.0.1", "port": PORT, **kw})


@pytest.mark.parametrize(
    "raw",
    [
        "/v1/%2e%2e/admin/drain",
        "/v1/%2E%2E/admin/drain",
        "/v1/../admin/drain",
        "/v1/./x",
        "/v1/.%2e/x",
        "/v1/chat/completions/..",
        "/v1/..%2fadmin/drain",
        "/v1/%252e%252e/x",
        "/v1/a%5cb",
        "/v1/a\\b",
        "/admin/models/%2e",
        "/..",
        "/v1/%2e%2e?x=1",
    ],
)
def test_dot_segments_and_encoded_separators_are_refused(raw):
    assert path_refusal(raw) is not None


@pytest.mark.parametrize(
    "raw",
    [
        "/v1/chat/completions",
        "/v1/chat/completions?stream=1&a=%2F..",
        "/admin/models/org/name",
        "/v1/models/a..b",
        "/v1/models/.hidden",
        "/health",
        "/v1/models/a%20b",
        "/",
        "/v1/models/mlx-community%2FQwen3-0.6B-4bit",
        "/admin/models/org%2fname",  # SDK ids
    ],
)
def test_ordinary_paths_pass(raw):
    assert path_refusal(raw) is None


@pytest.mark.parametrize(
    "header,name",
    [
        ("localhost:8080", "localhost"),
        ("LOCALHOST.", "localhost"),
        ("[::1]:8080", "::1"),
        ("127.0.0.1", "127.0.0.1"),
        ("a.example:80", "a.example"),
        ("::1", "::1"),
    ],
)
def test_host_name(header, name):
    assert host_name(header) == name


@pytest.mark.parametrize(
    "name,extra,ok",
    [
        ("localhost", {}, True),
        ("app.localhost", {}, True),
        ("127.0.0.1", {}, True),
        ("::1", {}, True),
        ("192.168.1.5", {}, True),  # an IP literal is never a rebound name
        ("evil.example", {}, False),
        ("localhost.evil.example", {}, False),
        ("evil.example", {"allowed_hosts": ["evil.example"]}, True),
        ("Box.Lan", {"allowed_hosts": ["box.lan:8080"]}, False),  # names are compared lowercased
        ("box.lan", {"allowed_hosts": ["Box.Lan:8080"]}, True),
        ("anything.example", {"allowed_hosts": ["*"]}, True),
        ("mybox.local", {"host": "mybox.local"}, True),  # the bind host
    ],
)
def test_host_allowed(name, extra, ok):
    assert host_allowed(name, settings(**extra)) is ok


@pytest.mark.parametrize(
    "origin,areas,extra,ok",
    [
        (f"http://localhost:{PORT}", {"admin"}, {}, True),  # the daemon's own pages
        (f"http://127.0.0.1:{PORT}", {"api"}, {}, True),
        (f"http://[::1]:{PORT}", {"admin"}, {}, True),
        ("http://localhost:3000", {"api"}, {}, False),  # another local server's page
        (f"https://localhost:{PORT}", {"api"}, {}, False),
        (f"http://evil.example:{PORT}", {"api"}, {}, False),
        ("null", {"api"}, {}, False),
        ("http://app.example", {"api"}, {"cors_origins": ["http://app.example"]}, True),
        ("http://app.example", set(), {"cors_origins": ["http://app.example"]}, True),  # /health
        ("http://app.example", {"admin"}, {"cors_origins": ["http://app.example"]}, False),
        ("http://any.example", {"api"}, {"cors_origins": ["*"]}, True),
        ("http://any.example", {"admin"}, {"cors_origins": ["*"]}, False),
        ("http://any.example", set(), {"cors_origins": ["*"]}, False),  # "*" is for /v1 only
        (f"http://box.lan:{PORT}", {"admin"}, {"allowed_hosts": ["box.lan"]}, True),
    ],
)
def test_origin_allowed(origin, areas, extra, ok):
    assert origin_allowed(origin, areas, settings(**extra), PORT) is ok


@pytest.mark.parametrize(
    "headers,refused",
    [
        ({}, False),
        ({"Content-Type": "application/json"}, False),
        ({"Content-Type": "Application/JSON; charset=utf-8"}, False),
        ({"Content-Type": "application/vnd.api+json"}, False),
        ({"Content-Type": "application/x-www-form-urlencoded"}, False),  # curl -d
        ({"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://a"}, True),
        ({"Content-Type": "text/plain"}, True),
        ({"Content-Type": "text/plain;charset=UTF-8", "Origin": "http://a"}, True),
        ({"Content-Type": "multipart/form-data; boundary=x"}, True),
        ({"Content-Type": "application/jsonx"}, True),
    ],
)
def test_content_type_rule(headers, refused):
    assert (content_type_refusal("POST", headers) is not None) is refused
    assert content_type_refusal("GET", headers) is None


def test_insecure_warning_only_for_an_open_network_bind():
    assert insecure_warning(settings(host="0.0.0.0", insecure=True)) is not None
    assert insecure_warning(settings(host="0.0.0.0", insecure=True, api_key="k")) is None
    assert insecure_warning(settings(host="localhost", insecure=True)) is None


# -- the middleware in an app, over a real socket ---------------------------------------------


async def _echo(request: web.Request) -> web.Response:
    return web.json_response({"got": len(await request.read())})


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def _app(**kw) -> web.Application:
    app = web.Application(
        middlewares=[error_middleware, guard_middleware, cors_middleware, auth_middleware]
    )
    app["settings"] = settings(**kw)
    app.router.add_post("/v1/chat/completions", _echo)
    app.router.add_post("/v1/messages", _echo)
    app.router.add_get("/admin/models", _ok)
    app.router.add_get("/health", _ok)
    add_cors(app)
    return app


async def _raw(port: int, request: bytes) -> tuple[int, dict, dict]:
    """Send `request` as written (no client normalizes its path); status, headers, JSON body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    status, headers = int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}
    return status, headers, orjson.loads(body) if body else {}


def _request(
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    body: bytes = b"{}",
    host: str | None = "127.0.0.1",
) -> bytes:
    h = {
        **({"Host": host} if host is not None else {}),
        "Content-Length": str(len(body)),
        "Connection": "close",
        **(headers or {}),
    }
    head = "".join(f"{k}: {v}\r\n" for k, v in h.items())
    version = "1.1" if host is not None else "1.0"  # HTTP/1.1 requires a Host
    return f"{method} {path} HTTP/{version}\r\n{head}\r\n".encode() + body


def _serve(calls: list[tuple], **kw) -> list[tuple[int, dict, dict]]:
    async def run():
        server = TestServer(_app(**kw), host="127.0.0.1")
        await server.start_server()
        try:
            own = {"Origin": f"http://127.0.0.1:{server.port}"}
            return [
                await _raw(
                    server.port, _request(*c[:1], c[1], own if c[2] == "own" else c[2], *c[3:])
                )
                for c in calls
            ]
        finally:
            await server.close()

    return asyncio.run(run())


def test_middleware_refusals_use_the_envelope_and_good_requests_pass():
    (drain, anth, host, no_host, admin_x, admin_own, site, text, form, ok, gz, unknown, bad_gz) = (
        _serve(
            [
                ("POST", "/v1/%2e%2e/admin/drain", {"Content-Type": "text/plain"}),
                ("POST", "/v1/messages/%2E%2E/x", {}),
                ("GET", "/health", {}, b"", "evil.example:8080"),
                ("POST", "/v1/chat/completions", {}, b"{}", None),
                ("GET", "/admin/models", {"Origin": "http://app.example"}),
                ("GET", "/admin/models", "own"),
                ("GET", "/admin/models", {"Sec-Fetch-Site": "cross-site"}),
                ("POST", "/v1/chat/completions", {"Content-Type": "text/plain"}),
                (
                    "POST",
                    "/v1/chat/completions",
                    {"Content-Type": FORM_CT, "Origin": "http://app.example"},
                ),
                ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}),
                (
                    "POST",
                    "/v1/chat/completions",
                    {"Content-Encoding": "gzip"},
                    gzip.compress(b"{}"),
                ),
                ("POST", "/v1/foo", {"Content-Type": "text/plain"}),
                ("POST", "/v1/chat/completions", {"Content-Encoding": "gzip"}, b"not gzip"),
            ],
            cors_origins=["http://app.example"],
        )
    )
    assert drain[0] == 400 and "'..'" in drain[2]["error"]["message"]
    assert anth[0] == 400 and anth[2]["type"] == "error"  # Anthropic's envelope on /v1/messages
    assert host[0] == 403 and "allowed_hosts" in host[2]["error"]["message"]
    assert no_host[0] == 200  # HTTP/1.0-style tools send no Host
    assert admin_x[0] == 403 and "access-control-allow-origin" not in admin_x[1]
    assert admin_own[0] == 200
    assert site[0] == 403
    assert text[0] == 415 and "application/json" in text[2]["error"]["message"]
    assert form[0] == 415
    assert ok == (200, ok[1], {"got": 2})
    assert gz[0] == 200 and gz[2] == {"got": 2}
    assert unknown[0] == 404 and "/v1/foo" in unknown[2]["error"]["message"]
    assert bad_gz[0] == 400 and "Content-Encoding" in bad_gz[2]["error"]["message"]


def test_cors_preflight_follows_the_guard():
    pre = {"Access-Control-Request-Method": "POST"}
    listed, foreign, admin = _serve(
        [
            ("OPTIONS", "/v1/chat/completions", {**pre, "Origin": "http://app.example"}, b""),
            ("OPTIONS", "/v1/chat/completions", {**pre, "Origin": "http://evil.example"}, b""),
            ("OPTIONS", "/admin/models", {**pre, "Origin": "http://app.example"}, b""),
        ],
        cors_origins=["http://app.example"],
    )
    assert listed[0] == 204 and listed[1]["access-control-allow-origin"] == "http://app.example"
    assert foreign[0] == 403 and "access-control-allow-origin" not in foreign[1]
    assert admin[0] == 403 and "access-control-allow-origin" not in admin[1]


def test_origin_of_the_requests_own_host_is_same_origin():
    # A page the daemon served through `ssh -L 9000:localhost:8080` or an https reverse proxy.
    s = settings()
    assert origin_allowed("http://localhost:9000", {"admin"}, s, PORT, host="localhost:9000")
    assert origin_allowed("https://mlxd.lan", {"api"}, s, PORT, host="mlxd.lan")
    assert not origin_allowed("http://evil.example:9000", {"api"}, s, PORT, host="localhost:9000")


def test_br_and_zstd_bodies_decode_and_a_bad_body_names_every_accepted_encoding():
    import brotli
    from backports import zstd

    br_ok, zstd_ok, bad_br, bad_zstd = _serve(
        [
            ("POST", "/v1/chat/completions", {"Content-Encoding": "br"}, brotli.compress(b"{}")),
            ("POST", "/v1/chat/completions", {"Content-Encoding": "zstd"}, zstd.compress(b"{}")),
            ("POST", "/v1/chat/completions", {"Content-Encoding": "br"}, b"not br"),
            ("POST", "/v1/chat/completions", {"Content-Encoding": "zstd"}, b"not zstd"),
        ]
    )
    assert br_ok[0] == 200 and br_ok[2] == {"got": 2}
    assert zstd_ok[0] == 200 and zstd_ok[2] == {"got": 2}
    for bad in (bad_br, bad_zstd):
        message = bad[2]["error"]["message"]
        assert bad[0] == 400
        assert all(enc in message for enc in ("gzip", "deflate", "br", "zstd")), message


def test_a_header_line_aiohttp_cannot_parse_is_one_log_line_not_a_traceback(caplog):
    from mlxd.supervisor.http.serverlog import SERVER_LOG

    caplog.set_level(logging.DEBUG)

    async def run():
        server = TestServer(_app(), host="127.0.0.1")
        await server.start_server(logger=SERVER_LOG, access_log=None)  # as the daemon has them
        try:
            replies = []
            for _ in range(2):
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(_request("GET", "/health", {"X-Big": "a" * 9000}, b""))
                replies.append(await reader.read())
                writer.close()
            return replies
        finally:
            await server.close()

    replies = asyncio.run(run())
    assert [reply.split(b" ")[1] for reply in replies] == [b"400", b"400"]
    said = [r for r in caplog.records if r.name.startswith(("aiohttp", "mlxd"))]
    assert len(said) == 2, [r.getMessage() for r in said]  # one line per bad request
    for r in said:
        assert r.exc_info is None and "Traceback" not in caplog.text
        assert r.getMessage().startswith("bad request 400 from 127.0.0.1: Got more than")


def test_a_coding_mlxd_does_not_decode_is_415_naming_the_accepted_ones():
    twice = gzip.compress(gzip.compress(b"{}"))
    listed, unknown, upper = _serve(
        [
            ("POST", "/v1/chat/completions", {"Content-Encoding": "gzip, gzip"}, twice),
            ("POST", "/v1/chat/completions", {"Content-Encoding": "compress"}, b"{}"),
            ("POST", "/v1/chat/completions", {"Content-Encoding": " GZIP "}, gzip.compress(b"{}")),
        ]
    )
    for refused in (listed, unknown):
        message = refused[2]["error"]["message"]
        assert refused[0] == 415 and "Content-Encoding" in message, refused
        assert all(enc in message for enc in ("gzip", "deflate", "br", "zstd")), message
    assert upper[0] == 200 and upper[2] == {"got": 2}
