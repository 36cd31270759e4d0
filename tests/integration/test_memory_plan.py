"""The worker's memory plan against a real worker (issue 18): a memory limit leaves the KV
budget its weights and headroom do not take; rows beyond it wait and complete, a row that
could never fit is a 413 naming the plan's numbers, and /stats and /health report the plan."""

from __future__ import annotations

import json
import struct
import threading

import pytest

from procs import start_worker, stop, uds_client

BYTES_PER_TOKEN = 4 * 2 * 64 * 2 * 4  # the tiny model's KV, float32 on the CPU
MiB = 1024 * 1024


def _float32_weights_bytes(folder) -> int:
    """The tiny model's parameters as the worker holds them on the CPU (float32)."""
    total = 0
    for f in folder.glob("*.safetensors"):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                count = 1
                for d in t["shape"]:
                    count *= d
                total += count * 4
    return total


@pytest.fixture(scope="module")
def planned(tiny_model_dir, short_tmp):
    weights = _float32_weights_bytes(tiny_model_dir)
    kv = 768 * BYTES_PER_TOKEN  # what the limit below leaves: 768 positions
    # A share this close to the weights: the headroom is half of what they leave (not a fifth
    # of the limit, which the tiny model's weights, large beside its KV, would make larger).
    assert weights >= 3 * kv
    limit = weights + 2 * kv
    sock, log = short_tmp / "memplan.sock", short_tmp / "memplan.log"
    proc = start_worker(
        tiny_model_dir,
        sock,
        "tiny",
        "--context-limit",
        "2048",
        "--prompt-cache-bytes",
        "0",
        "--memory-limit-bytes",
        str(limit),
        "--no-warmup",
        log=log,
    )
    yield sock, limit, weights
    stop(proc)


def _chat(c, content: str, max_tokens: int):
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    return c.post("/v1/chat/completions", json=body)


def test_the_plan_is_reported_and_bounds_mlx(planned):
    sock, limit, weights = planned
    with uds_client(sock) as c:
        stats = c.get("/stats").json()
        assert stats["memory_limit_bytes"] == limit and stats["weights_bytes"] == weights
        # limit - weights - the headroom (half of what the weights leave): 768 positions
        assert stats["kv_budget_bytes"] == 768 * BYTES_PER_TOKEN
        health = c.get("/health").json()
        assert health["memory_limit_bytes"] == limit
        assert health["memory_in_use_bytes"] >= weights


def test_rows_beyond_the_plan_wait_and_complete(planned):
    sock, _, _ = planned
    # Two rows of 512 positions each (prompt + max_tokens, padded) hold more than 768: one
    # waits for the other; both end at their max_tokens.
    out: dict = {}

    def ask(name):
        with uds_client(sock) as c:
            out[name] = _chat(c, "hi", 250)

    threads = [threading.Thread(target=ask, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for name in ("a", "b"):
        r = out[name]
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] <= 250


def test_a_row_that_could_never_fit_is_a_413_naming_the_plan(planned):
    sock, _, _ = planned
    with uds_client(sock) as c:
        r = _chat(c, "hi", 1000)  # ~1010 positions, padded 1024 > 768
        assert r.status_code == 413, r.text
        err = r.json()["error"]
        assert err["code"] == "kv_budget_exceeded"
        assert (
            "memory plan: limit" in err["message"] and "1000 reserved for output" in err["message"]
        )
        assert _chat(c, "hi", 4).status_code == 200  # and the worker serves on
