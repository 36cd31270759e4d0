"""Structured-output compiles are bounded: a real worker refuses what would take it down.

Over a static cap (a repetition count, a size) is a 400 before anything compiles. A constraint
within the caps that needs more than the compile's time (or memory) limit is a 400 too, with
code `grammar_too_complex`: it is a property of the request, and a retry fails the same way, so
it is not the server's 5xx. Compiles run in child processes, so other requests are served
meanwhile, and a client that leaves stops its compile.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import psutil
import pytest

from procs import CONTEXT_LIMIT, start_worker, stop, uds_client

MSG = [{"role": "user", "content": "Hello"}]
HUGE = {
    "type": "object",
    "properties": {"name": {"type": "string", "minLength": 1e9}},
    "required": ["name"],
}
NAME = "properties.name.minLength"
TIMEOUT_S = 3.0


def heavy(n: int) -> dict:
    """Within every static cap, but n generic JSON objects: far beyond a 3 s compile."""
    return {"type": "array", "items": {"type": "object"}, "minItems": n}


@pytest.fixture(scope="module")
def worker(tiny_model_dir, short_tmp):
    sock = short_tmp / "bounds.sock"
    proc = start_worker(
        tiny_model_dir,
        sock,
        "tiny",
        "--context-limit",
        str(CONTEXT_LIMIT),
        "--no-ssd-cache",
        "--grammar-compile-timeout-s",
        str(TIMEOUT_S),
        "--grammar-queue-timeout-s",
        "1",
        log=short_tmp / "bounds.log",
    )
    yield sock, proc
    stop(proc)


@pytest.fixture
def http(worker):
    with uds_client(worker[0]) as c:
        yield c


def chat(http, stream=False, **extra) -> httpx.Response:
    return http.post(
        "/v1/chat/completions", json={"messages": MSG, "max_tokens": 8, "stream": stream, **extra}
    )


def assert_still_serves(http) -> None:
    r = chat(http, guided_choice=["sunny", "rainy"])
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] in ("sunny", "rainy")


def over_children(pid: int, read) -> int:
    """`read(child)` summed over the worker's children. A child that exits between the listing
    and its read is skipped: a compile being stopped (what the callers wait for) holds nothing."""
    total = 0
    for kid in psutil.Process(pid).children():
        try:
            total += read(kid)
        except psutil.NoSuchProcess:
            pass
    return total


def compile_children(proc) -> int:
    """How many grammar children the worker has: one idle spare, plus one per compile."""
    return over_children(proc.pid, lambda k: k.status() != psutil.STATUS_ZOMBIE)


@pytest.mark.parametrize(
    "path,body,param",
    [
        (
            "/v1/chat/completions",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": HUGE},
                }
            },
            "response_format.json_schema.schema." + NAME,
        ),
        ("/v1/chat/completions", {"guided_json": HUGE}, "guided_json." + NAME),
        ("/v1/completions", {"prompt": "Hi", "guided_json": HUGE}, "guided_json." + NAME),
        (
            "/v1/responses",
            {
                "input": "Hi",
                "text": {"format": {"type": "json_schema", "name": "x", "schema": HUGE}},
            },
            "text.format.schema." + NAME,
        ),
    ],
)
def test_huge_min_length_is_a_fast_400_naming_the_field(http, path, body, param):
    for stream in (False, True):
        started = time.monotonic()
        r = http.post(
            path,
            json={"messages": MSG, "max_tokens": 8, "stream": stream, **body}
            if path == "/v1/chat/completions"
            else {"max_tokens": 8, **body, "stream": stream},
        )
        assert r.status_code == 400, r.text
        assert time.monotonic() - started < 5.0
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == "grammar_too_large"
        assert err["param"] == param
        assert "1000000000" in err["message"] and "grammar_max_repeat" in err["message"]
    assert_still_serves(http)


def test_anthropic_surface_gets_its_own_envelope(http):
    r = http.post(
        "/v1/messages",
        json={
            "model": "tiny",
            "max_tokens": 8,
            "messages": MSG,
            "output_format": {"type": "json_schema", "schema": HUGE},
        },
    )
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "output_format.schema." + NAME in body["error"]["message"]


@pytest.mark.parametrize(
    "extra",
    [
        {"guided_regex": ".{1,65535}"},
        {"guided_regex": "(a{300}){300}"},  # each count is fine; together 90 000 copies
        {
            "guided_grammar": "\n".join(
                [f"r{i} ::= r{i + 1} r{i + 1}" for i in range(40)] + ['r40 ::= "ab"']
            )
        },  # 2^40 characters once inlined
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {
                            "type": "object",
                            "properties": {"a": {"type": "string", "maxLength": 70000}},
                        },
                    },
                }
            ],
            "tool_choice": "required",
        },
    ],
)
def test_over_the_caps_is_a_400_and_the_worker_still_serves(http, extra):
    r = chat(http, **extra)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "grammar_too_large"
    assert "grammar_max_" in r.json()["error"]["message"]
    assert_still_serves(http)


def test_a_compile_over_the_time_limit_is_a_400_while_others_are_served(http, worker):
    answers: dict[str, httpx.Response] = {}

    def slow():
        with uds_client(worker[0]) as c:
            answers["slow"] = chat(c, guided_json=heavy(20))
            answers["slow_at"] = time.monotonic()

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.5)
    assert_still_serves(http)  # answered while the heavy schema compiles
    served_at = time.monotonic()
    t.join(60)
    r = answers["slow"]
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "grammar_too_complex" and err["param"] == "guided_json"
    assert (
        "grammar_compile_timeout_s" in err["message"]
        or "grammar_compile_memory_bytes" in err["message"]
    )
    assert served_at < answers["slow_at"]  # the normal request did not wait for it
    # The same constraint again is refused at once: the failure is remembered.
    again = time.monotonic()
    assert chat(http, guided_json=heavy(20)).status_code == 400
    assert time.monotonic() - again < TIMEOUT_S
    assert_still_serves(http)


# 2,400 optional properties: 61 KB of schema (under grammar_max_bytes), a ~190 MB regex
# (optional properties grow quadratically). Until 2026-12-07 a forced call's regex was built
# in the worker, on its event loop: 8,000 such properties (still in the body cap) froze the
# model for 30 s, until the supervisor's watchdog killed the worker with every row in flight.
WIDE = {"type": "object", "properties": {f"a{i}": {"type": "string"} for i in range(2400)}}


@pytest.mark.parametrize(
    "name,choice",
    [("f", "required"), ("g", {"type": "function", "function": {"name": "g"}})],
    ids=["required", "named"],
)  # two names: a compile that ran out of time is remembered by its constraint
def test_a_forced_tool_call_is_built_in_the_compile_child_while_others_are_served(
    http, worker, name, choice
):
    answers: dict[str, Any] = {}
    tools = [{"type": "function", "function": {"name": name, "parameters": WIDE}}]

    def slow():
        with uds_client(worker[0]) as c:
            answers["slow"] = chat(c, tools=tools, tool_choice=choice)
            answers["slow_at"] = time.monotonic()

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.3)
    assert_still_serves(http)
    served_at = time.monotonic()
    t.join(60)
    r = answers["slow"]
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] in ("grammar_too_large", "grammar_too_complex")
    assert err["param"] == "tool_choice"
    assert served_at < answers["slow_at"]  # the normal request did not wait for it
    assert_still_serves(http)


def test_full_compile_slots_give_a_clear_503(worker, http):
    def held(n: int) -> None:
        with uds_client(worker[0]) as c:
            chat(c, guided_json=heavy(n))

    hold = [threading.Thread(target=held, args=(n,)) for n in (21, 22)]
    for t in hold:
        t.start()
    deadline = time.monotonic() + 10
    while compile_children(worker[1]) < 3:  # the spare and both held compiles: slots full
        assert time.monotonic() < deadline, "the two held compiles did not start"
        time.sleep(0.02)
    r = chat(http, guided_json=heavy(23))
    for t in hold:
        t.join(60)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "grammar_busy"
    assert "grammar_compile_concurrency" in r.json()["error"]["message"]
    assert_still_serves(http)  # slots free again once the held compiles are refused


def test_a_client_that_leaves_stops_its_compile(worker, http):
    _, proc = worker
    with uds_client(worker[0], timeout_s=0.8) as c, pytest.raises(httpx.ReadTimeout):
        chat(c, guided_json=heavy(24))
    left = time.monotonic()
    # Killed on the disconnect, well before its own time limit would have ended it.
    while compile_children(proc) > 1 and time.monotonic() - left < 1.0:
        time.sleep(0.05)
    assert compile_children(proc) <= 1
    assert_still_serves(http)


def test_worker_memory_stays_bounded(worker, http):
    # A sanity bound: unbounded, minLength 1e9 alone took a worker to 9 GB.
    for extra in ({"guided_json": HUGE}, {"guided_regex": ".{1,65535}"}):
        chat(http, **extra)
    rss = psutil.Process(worker[1].pid).memory_info().rss
    kids = over_children(worker[1].pid, lambda k: k.memory_info().rss)
    assert rss + kids < 3 * 1024**3
