"""The dashboard's supervisor side without processes: Accept negotiation, the page's headers,
the eviction order, GET /admin/memory and the log stream (docs/dashboard.md)."""

from __future__ import annotations

import asyncio

from fake_workers import with_app

from mlxd.supervisor.admin import logstream
from mlxd.supervisor.policy.eviction import Resident, eviction_candidates
from mlxd.supervisor.ui.routes import page_response, wants_html

CHROME = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8"


def test_only_a_browser_accept_header_gets_the_page():
    assert wants_html(CHROME)
    assert wants_html("text/html")
    assert not wants_html("")  # Ollama clients, curl without -H
    assert not wants_html("*/*")
    assert not wants_html("application/json")
    assert not wants_html("text/plain, text/html;q=0.5")
    assert not wants_html("text/html;q=0")
    assert not wants_html("text/html;q=oops")


def test_the_page_forbids_inline_script_and_framing():
    r = page_response()
    csp = r.headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "script-src 'self'" in csp
    assert "frame-ancestors 'none'" in csp and "unsafe" not in csp
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert b"<script" in r.body and b"<script>" not in r.body  # no inline script
    assert page_response("app.js").content_type == "text/javascript"


def test_eviction_candidates_are_idle_ready_unpinned_oldest_first():
    res = [
        Resident("new", 1, 0, 9.0, False),
        Resident("busy", 1, 1, 0.0, False),
        Resident("pin", 1, 0, 0.0, True),
        Resident("starting", 1, 0, 0.0, False, evictable=False),
        Resident("old", 1, 0, 1.0, False),
    ]
    assert [r.id for r in eviction_candidates(res)] == ["old", "new"]


def test_memory_names_the_budget_and_what_an_eviction_takes_first(tmp_path):
    async def go(client, reg, app):
        empty = await (await client.get("/admin/memory")).json()
        for model in ("b", "a"):  # b is used first, so it is the older one
            assert (await client.post(f"/admin/models/{model}/load", json={})).status == 200
        return empty, await (await client.get("/admin/memory")).json()

    empty, full = with_app(tmp_path, go)
    assert empty["models"] == [] and empty["used_bytes"] == 0
    assert empty["free_bytes"] == empty["budget_bytes"] > 0
    assert {m["id"] for m in full["models"]} == {"a", "b"}
    assert full["used_bytes"] == sum(m["footprint_bytes"] for m in full["models"]) > 0
    assert full["eviction_order"] == ["b", "a"]
    assert all(m["evictable"] and m["state"] == "ready" for m in full["models"])


async def _events(resp, count: int) -> list[bytes]:
    """The next `count` SSE blocks (comments included) of a streaming response."""
    blocks, buf = [], b""
    while len(blocks) < count:
        buf += await asyncio.wait_for(resp.content.readany(), 5)
        while b"\n\n" in buf:
            block, buf = buf.split(b"\n\n", 1)
            blocks.append(block)
    return blocks


def test_the_log_stream_sends_the_tail_then_new_lines_and_is_bounded(tmp_path):
    async def go(client, reg, app):
        path = logstream.current_log(reg, "a")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("one\ntwo\nthree\n")
        resp = await client.get("/admin/logs/stream", params={"model": "a", "tail": "2"})
        assert resp.headers["Content-Type"] == "text/event-stream"
        first = await _events(resp, 2)
        with open(path, "a") as f:
            f.write("four\n")
        later = await _events(resp, 1)
        app[logstream.STREAMS].open = logstream.MAX_STREAMS  # as if every stream were taken
        full = await client.get("/admin/logs/stream", params={"model": "a"})
        app[logstream.STREAMS].open = 1
        bad = await client.get("/admin/logs/stream", params={"model": "a", "tail": "x"})
        unknown = await client.get("/admin/logs/stream", params={"model": "nope"})
        resp.close()
        return first, later, full.status, bad.status, unknown.status

    first, later, full, bad, unknown = with_app(tmp_path, go)
    assert first[0].startswith(b"event: file\n") and b'"file":"a.log"' in first[0]
    assert first[1] == b'event: lines\ndata: {"lines":["two","three"]}'
    assert later == [b'event: lines\ndata: {"lines":["four"]}']
    assert (full, bad, unknown) == (429, 400, 404)
