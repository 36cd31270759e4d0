"""Every client mistake is a 4xx in the OpenAI envelope, and never disturbs other rows."""

from __future__ import annotations

import threading

import orjson
import pytest

from procs import CONTEXT_LIMIT, MAX_BODY_BYTES

CHAT = "/v1/chat/completions"
OK_MSG = [{"role": "user", "content": "hi"}]

BAD = [
    ("malformed json", "POST", CHAT, b"{not json", 400, None),
    ("not an object", "POST", CHAT, b"[1, 2]", 400, None),
    ("missing messages", "POST", CHAT, {"model": "tiny"}, 400, "messages"),
    ("empty messages", "POST", CHAT, {"messages": []}, 400, "messages"),
    (
        "bad role",
        "POST",
        CHAT,
        {"messages": [{"role": "robot", "content": "x"}]},
        400,
        "messages.0.role",
    ),
    (
        "temperature as string",
        "POST",
        CHAT,
        {"messages": OK_MSG, "temperature": "hot"},
        400,
        "temperature",
    ),
    (
        "temperature too high",
        "POST",
        CHAT,
        {"messages": OK_MSG, "temperature": 7},
        400,
        "temperature",
    ),
    ("top_p zero", "POST", CHAT, {"messages": OK_MSG, "top_p": 0}, 400, "top_p"),
    ("max_tokens zero", "POST", CHAT, {"messages": OK_MSG, "max_tokens": 0}, 400, "max_tokens"),
    (
        "max_tokens as float",
        "POST",
        CHAT,
        {"messages": OK_MSG, "max_tokens": 1.5},
        400,
        "max_tokens",
    ),
    ("n above one", "POST", CHAT, {"messages": OK_MSG, "n": 2}, 400, "n"),
    ("stop as number", "POST", CHAT, {"messages": OK_MSG, "stop": 5}, 400, "stop"),
    ("empty stop", "POST", CHAT, {"messages": OK_MSG, "stop": [""]}, 400, "stop"),
    (
        "logit_bias key",
        "POST",
        CHAT,
        {"messages": OK_MSG, "logit_bias": {"abc": 1}},
        400,
        "logit_bias",
    ),
    (
        "logit_bias beyond vocab",
        "POST",
        CHAT,
        {"messages": OK_MSG, "logit_bias": {"999999": 1}},
        400,
        "logit_bias",
    ),
    (
        "top_logprobs too many",
        "POST",
        CHAT,
        {"messages": OK_MSG, "logprobs": True, "top_logprobs": 21},
        400,
        "top_logprobs",
    ),
    (
        "prompt over context",
        "POST",
        CHAT,
        {"messages": [{"role": "user", "content": "word " * (CONTEXT_LIMIT * 2)}]},
        400,
        "messages",
    ),
    (
        "completion token out of vocab",
        "POST",
        "/v1/completions",
        {"prompt": [1, 10**9]},
        400,
        "prompt",
    ),
    ("completion empty prompt", "POST", "/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("two prompts", "POST", "/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("body over limit", "POST", CHAT, b"x" * (MAX_BODY_BYTES + 10), 413, None),
    ("unknown path", "POST", "/v1/nothing", {}, 404, None),
    ("wrong method", "GET", CHAT, None, 405, None),
]


@pytest.mark.parametrize("name,method,path,body,status,param", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_a_clear_4xx(http, name, method, path, body, status, param):
    content = body if isinstance(body, bytes) or body is None else orjson.dumps(body)
    r = http.request(method, path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and "Traceback" not in err["message"]
    assert err["type"]
    if param:
        assert err["param"] == param


def test_bad_requests_do_not_disturb_a_stream(oai, http):
    result = {}

    def run():
        chunks = list(
            oai.chat.completions.create(
                model="tiny", messages=OK_MSG, max_tokens=60, temperature=0, stream=True
            )
        )
        result["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        result["text"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    t = threading.Thread(target=run)
    t.start()
    for _, method, path, body, status, _ in BAD[:18]:
        content = body if isinstance(body, bytes) or body is None else orjson.dumps(body)
        assert http.request(method, path, content=content).status_code == status
    t.join(60)
    assert result["finish"] == "length"
    plain = oai.chat.completions.create(model="tiny", messages=OK_MSG, max_tokens=60, temperature=0)
    assert result["text"] == plain.choices[0].message.content
