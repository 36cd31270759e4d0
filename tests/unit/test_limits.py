"""Connection caps and the descriptor limit, without a server."""

from __future__ import annotations

import resource

import orjson

from mlxd.shared.errors import TooManyRequests, Unavailable
from mlxd.supervisor.http.limits import (
    RESERVED_FDS,
    ConnectionLimiter,
    connection_cap,
    raise_nofile_limit,
    refusal_bytes,
)


def test_per_client_cap_refuses_that_client_only_and_frees_on_release():
    lim = ConnectionLimiter(max_total=10, max_per_client=2)
    assert lim.admit("10.0.0.1") is None
    assert lim.admit("10.0.0.1") is None
    refused = lim.admit("10.0.0.1")
    assert isinstance(refused, TooManyRequests)
    assert lim.admit("10.0.0.2") is None  # another client is still served
    lim.release("10.0.0.1")
    assert lim.admit("10.0.0.1") is None
    assert lim.total == 3 and lim.refused == 1


def test_total_cap_refuses_with_503_and_counts_go_back_to_zero():
    lim = ConnectionLimiter(max_total=2, max_per_client=5)
    assert lim.admit("a") is None and lim.admit("b") is None
    assert isinstance(lim.admit("c"), Unavailable)
    for c in ("a", "b"):
        lim.release(c)
    assert lim.total == 0 and lim.per_client == {}


def test_refusal_is_a_complete_http_response_in_the_error_envelope():
    raw = refusal_bytes(TooManyRequests("Too many open connections", code="too_many_connections"))
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 429 ")
    assert b"Connection: close" in head and f"Content-Length: {len(body)}".encode() in head
    assert orjson.loads(body)["error"]["code"] == "too_many_connections"


def test_total_cap_stays_under_the_descriptor_limit():
    assert connection_cap(1024, 256) == 256 - RESERVED_FDS
    assert connection_cap(1024, 65536) == 1024
    assert connection_cap(1024, 100) == 16  # a floor, so a tiny limit still serves someone


def test_nofile_limit_is_raised_toward_the_target_and_never_lowered():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        before, after = raise_nofile_limit(target=soft + 1 if hard > soft else soft)
        assert before == soft and after >= soft
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == after
        assert raise_nofile_limit(target=16) == (after, after)  # a lower target changes nothing
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_client_holding_most_of_its_cap_is_crowded_and_its_bodies_get_less_time():
    from mlxd.supervisor.http.body_deadline import body_deadline_s

    lim = ConnectionLimiter(max_total=100, max_per_client=4)
    for _ in range(2):
        assert lim.admit("127.0.0.1") is None
    assert not lim.crowded("127.0.0.1")
    assert body_deadline_s(lim, "127.0.0.1", 60.0, 15.0) == 60.0
    assert lim.admit("127.0.0.1") is None  # 3 of 4
    assert lim.crowded("127.0.0.1") and not lim.crowded("10.0.0.2")
    assert body_deadline_s(lim, "127.0.0.1", 60.0, 15.0) == 15.0
    assert body_deadline_s(lim, "127.0.0.1", 5.0, 15.0) == 5.0  # never longer than the setting
    lim.release("127.0.0.1")
    assert body_deadline_s(lim, "127.0.0.1", 60.0, 15.0) == 60.0  # places freed: full time
    assert body_deadline_s(None, "127.0.0.1", 60.0, 15.0) == 60.0


def test_a_server_holding_most_of_its_total_cap_is_crowded_for_everyone():
    lim = ConnectionLimiter(max_total=4, max_per_client=4)
    for client in ("a", "b", "c"):
        assert lim.admit(client) is None
    assert lim.crowded("d")
