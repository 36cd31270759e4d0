"""Claude Code's and Codex's default requests against a real worker (issue 12).

The agents' bodies (tests/agent_bodies.py) take ~700 and ~1100 tokens of the tiny model's
wordy tokenizer, so this module's worker has a context of CONTEXT_LIMIT (2048) tokens rather
than the shared fixture's 512. Each test pads the conversation so that only a few tokens of
room remain: the client's max_tokens (32000 for Claude Code, none for Codex) is clamped to
that room, the answer is a 200, and it ends saying the limit stopped it.
"""

from __future__ import annotations

import copy
import json
import re
import time

import pytest
from agent_bodies import CLAUDE_CODE_BODY, CODEX_BODY

from procs import MAX_BODY_BYTES, start_worker, stop

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
RESPONSES = "/v1/responses"
ROOM = 3  # tokens left for the answer
CONTEXT_LIMIT = 2048


@pytest.fixture(scope="module")
def worker(tiny_model_dir, short_tmp):
    sock = short_tmp / "agents.sock"
    proc = start_worker(
        tiny_model_dir,
        sock,
        "tiny",
        "--context-limit",
        str(CONTEXT_LIMIT),
        "--max-body-bytes",
        str(MAX_BODY_BYTES),
        log=short_tmp / "agents.log",
    )
    yield sock
    stop(proc)


def _fill(prompt_tokens, room: int = ROOM) -> int:
    """Words of padding that leave `room` tokens (or a token or two more) in the context;
    `prompt_tokens(words)` is the prompt's length with that much padding."""
    base, step = prompt_tokens(0), prompt_tokens(50)
    per_word = (step - base) / 50
    words = int((CONTEXT_LIMIT - room - base) / per_word)
    for _ in range(8):
        got = CONTEXT_LIMIT - prompt_tokens(words)
        if room <= got <= room + 2:
            return words
        words += 1 if got > room else -1
    raise AssertionError(
        f"cannot pad the prompt to leave {room} tokens (unpadded: {base}, {per_word} a word)"
    )


def _pad(text: str, words: int) -> str:
    return text + " word" * words


def _sse(text: str) -> list[tuple[str, dict]]:
    events = []
    for block in text.split("\n\n"):
        name, data = None, None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: ") and line[6:] != "[DONE]":
                data = json.loads(line[6:])
        if data is not None:
            events.append((name or data.get("type"), data))
    return events


# -- Claude Code on /v1/messages ------------------------------------------------------------
def _claude_body(words: int, stream: bool) -> dict:
    body = copy.deepcopy(CLAUDE_CODE_BODY)
    body["stream"], body["temperature"] = stream, 0
    body["messages"][-1]["content"].append({"type": "text", "text": _pad("Now", words)})
    return body


def _claude_words(http) -> int:
    def count(words: int) -> int:
        r = http.post("/v1/messages/count_tokens", json=_claude_body(words, False))
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    return _fill(count)


def test_claude_code_max_tokens_32000_is_clamped_and_the_answer_ends_at_max_tokens(http):
    words = _claude_words(http)
    r = http.post(MESSAGES, json=_claude_body(words, False))
    assert r.status_code == 200, r.text
    msg = r.json()
    u = msg["usage"]
    prompt = u["input_tokens"] + u["cache_read_input_tokens"]
    assert u["output_tokens"] == CONTEXT_LIMIT - prompt  # all the room, none beyond it
    assert msg["stop_reason"] == "max_tokens"


def test_claude_code_stream_ends_with_stop_reason_max_tokens(http):
    words = _claude_words(http)
    r = http.post(MESSAGES, json=_claude_body(words, True))
    assert r.status_code == 200, r.text
    events = _sse(r.text)
    deltas = [d for name, d in events if name == "message_delta" and d["delta"]["stop_reason"]]
    assert deltas[-1]["delta"]["stop_reason"] == "max_tokens"
    assert events[-1][0] == "message_stop"


def test_a_prompt_that_fills_the_context_is_refused_in_anthropic_words(http):
    body = _claude_body(CONTEXT_LIMIT, False)
    r = http.post(MESSAGES, json=body)
    assert r.status_code == 400, r.text
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    found = re.fullmatch(
        r"input length and `max_tokens` exceed context limit: (\d+) \+ 32000 "
        r"> 2048, decrease input length or `max_tokens` and try again",
        err["error"]["message"],
    )
    assert found, err["error"]["message"]
    counted = http.post("/v1/messages/count_tokens", json=body).json()["input_tokens"]
    assert int(found.group(1)) == counted >= CONTEXT_LIMIT


def test_the_mid_conversation_system_message_reaches_the_prompt(http):
    without = copy.deepcopy(CLAUDE_CODE_BODY)
    del without["messages"][1]
    count = [
        http.post("/v1/messages/count_tokens", json=b).json()["input_tokens"]
        for b in (CLAUDE_CODE_BODY, without)
    ]
    assert count[0] > count[1]


# -- Codex on /v1/responses -----------------------------------------------------------------
def _codex_body(words: int, stream: bool = True) -> dict:
    body = copy.deepcopy(CODEX_BODY)
    body["stream"], body["temperature"] = stream, 0
    body["input"][1]["content"][0]["text"] = _pad("fix the failing test", words)
    return body


def test_codex_stream_is_a_200_that_ends_incomplete_at_the_context_limit(http):
    def count(words: int) -> int:
        body = {**_codex_body(words, stream=False), "max_output_tokens": 1}
        r = http.post(RESPONSES, json=body)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["input_tokens"]

    r = http.post(RESPONSES, json=_codex_body(_fill(count)))
    assert r.status_code == 200, r.text
    assert "web_search" in r.headers["Warning"] and "image_generation" in r.headers["Warning"]
    name, final = _sse(r.text)[-1]
    assert name == "response.incomplete"
    resp = final["response"]
    assert resp["status"] == "incomplete"
    assert resp["incomplete_details"] == {"reason": "max_output_tokens"}
    assert resp["usage"]["input_tokens"] + resp["usage"]["output_tokens"] == CONTEXT_LIMIT


# -- chat completions and completions ---------------------------------------------------------
def test_chat_max_tokens_beyond_the_context_is_clamped_with_finish_reason_length(http):
    def body(words: int, max_tokens: int = 32000) -> dict:
        return {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": _pad("hi", words)},
                {"role": "system", "content": REMINDER_CHAT},
            ],
            "max_tokens": max_tokens,
            "temperature": 0,
        }

    def count(words: int) -> int:
        r = http.post(CHAT, json=body(words, 1))
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    r = http.post(CHAT, json=body(_fill(count)))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["total_tokens"] == CONTEXT_LIMIT


REMINDER_CHAT = "Reminder: answer in English."


def test_completions_suffix_is_ignored_with_a_warning(http):
    r = http.post(
        "/v1/completions",
        json={
            "prompt": "def add(a, b):",
            "suffix": "\n\nprint(1)",
            "max_tokens": 2,
            "temperature": 0,
        },
    )
    assert r.status_code == 200, r.text
    assert "suffix" in r.headers["Warning"] and r.headers["Warning"].startswith("299 mlxd")
    r = http.post("/v1/completions", json={"prompt": "def add(a, b):", "max_tokens": 2})
    assert r.status_code == 200 and "Warning" not in r.headers


# -- an abandoned request leaves a line ------------------------------------------------------
def test_a_stream_the_client_abandons_is_logged_as_499(http, short_tmp):
    body = {
        "messages": [{"role": "user", "content": "count to a thousand"}],
        "stream": True,
        "max_tokens": 1500,
        "temperature": 1.0,
        "seed": 3,
    }
    with http.stream("POST", CHAT, json=body, headers={"x-request-id": "abandoned-1"}) as r:
        assert r.status_code == 200
        next(r.iter_raw())  # the stream started; now leave
    log = short_tmp / "agents.log"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        lines = [ln for ln in log.read_text().splitlines() if "request_id=abandoned-1" in ln]
        if lines:
            break
        time.sleep(0.2)
    assert lines, "no access-log line for the abandoned request"
    found = re.search(
        r"POST /v1/chat/completions 499 [\d.]+s request_id=abandoned-1 cancelled "
        r"prompt_tokens=(\d+) prompt_done=(\d+) completion_tokens=(\d+)",
        lines[-1],
    )
    assert found, lines[-1]
    assert int(found.group(1)) > 0
    # and the worker serves the next request as usual
    r = http.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200, r.text
