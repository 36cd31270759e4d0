"""The Responses store's watch on a passing stream: it finds the finished response, and a
final event it cannot parse costs only the stored turn, never the client's stream."""

from __future__ import annotations

from mlxd.supervisor.http.responses import _FinalEvent

DONE = b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"r1"}}\n\n'


def test_the_final_event_is_found_across_chunks():
    watch = _FinalEvent()
    on_chunk = watch.chain(None)
    for piece in (b"event: response.created\ndata: {}\n\n", DONE[:30], DONE[30:]):
        assert on_chunk(piece) is False
    assert watch.response == {"id": "r1"}


def test_a_final_event_that_does_not_parse_is_not_stored_and_does_not_raise():
    watch = _FinalEvent()
    on_chunk = watch.chain(None)
    # A lone surrogate escape: valid to some JSON readers, refused by orjson.
    bad = b'event: response.completed\ndata: {"response":{"id":"r1","x":"\\ud800"}}\n\n'
    assert on_chunk(bad) is False
    assert watch.response is None
    on_chunk(b"event: response.failed\ndata: [1, 2]\n\n")  # not an object either
    assert watch.response is None
