"""Thousands of generated hostile requests against a real daemon: no 5xx, no worker restart.

Some make the model write values JSON writers refuse (big integers, NaN, lone surrogates) into
tool calls and text on every surface, streamed or not; a stream that never ends is a timeout.

`make test` sends MLXD_FUZZ_N cases (default 500, seconds here), `make test-slow` 5000; a long run:
    MLXD_FUZZ_N=50000 MLXD_FUZZ_SEED=7 .venv/bin/pytest -q tests/e2e/test_fuzz.py
A failure prints the seed, the case number and the request, so it replays.
"""

from __future__ import annotations

import asyncio
import os

import httpx
from fuzz_bodies import generate

FUZZ_N = int(os.environ.get("MLXD_FUZZ_N", "500"))
FUZZ_SEED = int(os.environ.get("MLXD_FUZZ_SEED", "20261201"))
CONCURRENCY = 8
# An internal failure inside a 200 stream shows as an error event of these types (an Ollama
# NDJSON stream's error line names no type).
SERVER_ERROR_MARKS = (
    b'"type":"server_error"',
    b'"type":"api_error"',
    b'{"error":"Internal server error',
)


async def _send_all(url: str, cases) -> list[str]:
    problems: list[str] = []
    queue: asyncio.Queue = asyncio.Queue()
    for item in cases:
        queue.put_nowait(item)

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            i, case = queue.get_nowait()
            try:
                r = await client.request(
                    case.method, case.path, content=case.body or None, headers=case.headers
                )
            except httpx.HTTPError as exc:
                problems.append(f"case {i}: {type(exc).__name__} {exc}: {case.describe()}")
                continue
            if r.status_code >= 500 or any(m in r.content for m in SERVER_ERROR_MARKS):
                problems.append(f"case {i}: {r.status_code} {r.content[:300]!r}: {case.describe()}")

    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(CONCURRENCY)))
    return problems


def test_generated_requests_get_no_5xx_and_leave_the_worker_serving(make_daemon):
    d = make_daemon(config="context_limit = 512\n")  # room for the tool prompts of value cases
    d.openai().chat.completions.create(  # load the model first: its pid is the baseline
        model="a", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    pids = d.worker_pids("a")
    assert len(pids) == 1

    problems = asyncio.run(_send_all(d.url, enumerate(generate(FUZZ_SEED, FUZZ_N))))

    assert not problems, (
        f"seed={FUZZ_SEED}: {len(problems)} of {FUZZ_N} cases failed:\n" + "\n".join(problems[:20])
    )
    assert d.worker_pids("a") == pids, "a worker restarted during the fuzz run"
    card = d.http.get("/admin/models/a").json()
    assert card["state"] == "ready" and card.get("restarts", 0) == 0, card
    reply = d.openai().chat.completions.create(
        model="a", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert "Traceback" not in d.logs() and "unhandled error" not in d.logs()
