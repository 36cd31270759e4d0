"""A storm of clients that leave at random points leaves no row generating for nobody."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import httpx

from procs import uds_client

CLIENTS = 24


def leave_at_random(url: str, i: int) -> str:
    """One client: a stream it drops after a random number of chunks (0: before the first),
    or a plain request it stops waiting for."""
    rng = random.Random(i)
    body = {
        "model": "a",
        "messages": [{"role": "user", "content": f"count to a thousand, client {i} " * 8}],
        "max_tokens": 1500,
        "temperature": 1.0,
        "seed": i,
        "stream": i % 4 != 3,
    }
    try:
        if not body["stream"]:  # the client's own timeout ends it mid-generation
            httpx.post(url + "/v1/chat/completions", json=body, timeout=0.2 + rng.random())
            return "finished"
        with (
            httpx.Client(base_url=url, timeout=60) as c,
            c.stream("POST", "/v1/chat/completions", json=body) as r,
        ):
            assert r.status_code == 200, r.read()
            for n, _ in enumerate(r.iter_raw()):
                if n >= rng.randrange(0, 30):
                    return "left"
        return "finished"
    except httpx.TimeoutException:
        return "left"


def test_every_row_ends_when_its_client_leaves(make_daemon):
    d = make_daemon()
    with ThreadPoolExecutor(CLIENTS) as pool:
        outcomes = list(pool.map(lambda i: leave_at_random(d.url, i), range(CLIENTS)))
    assert outcomes.count("left") >= CLIENTS // 2
    with uds_client(d.home / "run" / "a.sock", 10) as c:

        def idle() -> dict | None:
            st = c.get("/stats").json()
            return st if st["rows_active"] == 0 and st["rows_queued"] == 0 else None

        before = d.wait_for(idle, 60, "every row to leave")["generation_tokens"]
        assert d.http.get("/admin/stats").json()["supervisor"]["leases"] == 0
        # Nothing generates any more: one more token is exactly one more token counted.
        body = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        assert d.http.post("/v1/chat/completions", json=body).status_code == 200
        assert c.get("/stats").json()["generation_tokens"] == before + 1
