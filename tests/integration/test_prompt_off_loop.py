"""A prompt is rendered and tokenized off the worker's event loop (chat/run.py): while one
request's long conversation is being tokenized, other requests are answered. By order of
events: the first request's tokenizing is held until the second has its whole answer."""

from __future__ import annotations

import threading

import httpx
import pytest
from inproc import serving, stop_engine, worker_state

HANG_S = 120
# The second request's bound: it fails the test (a read timeout) when the held tokenizing
# blocks the event loop, instead of hanging until HANG_S. A 4-token answer takes < 1 s.
BLOCKED_S = 30
MARK = "lighthouse-ledger-mark"


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    """(base URL, worker state): the worker's app on 127.0.0.1, its event loop in a thread."""
    state = worker_state(tiny_model_dir)
    with serving(state, HANG_S) as url:
        yield url, state
    stop_engine(state)


def chat(url: str, text: str, timeout_s: float = HANG_S) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    return httpx.post(
        url + "/v1/chat/completions", json={**body, "temperature": 0}, timeout=timeout_s
    )


def test_a_request_is_answered_while_another_ones_prompt_is_being_tokenized(served):
    url, state = served
    hf = state.loaded.tokenizer._tokenizer
    encode = hf.encode
    entered, release = threading.Event(), threading.Event()

    def held_encode(text, *args, **kwargs):
        if MARK in text:  # the long conversation's turn: hold it here
            entered.set()
            assert release.wait(HANG_S)
        return encode(text, *args, **kwargs)

    hf.encode = held_encode
    try:
        first: list[httpx.Response] = []
        slow = threading.Thread(target=lambda: first.append(chat(url, f"{MARK} hello")))
        slow.start()
        assert entered.wait(HANG_S)
        other = chat(url, "Another question", BLOCKED_S)  # answered while the first is held
        assert other.status_code == 200 and other.json()["choices"][0]["message"]["content"]
        assert not first  # the held request has not been answered yet
        release.set()
        slow.join(HANG_S)
    finally:
        release.set()
        del hf.encode
    assert first and first[0].status_code == 200
