"""`mlxctl run`'s stream reader over a canned SSE stream: what it prints and what it keeps."""

import io

import httpx
import orjson
import pytest

from mlxd.supervisor.ctl.client import CtlError
from mlxd.supervisor.ctl.run import Chat, Printer


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _sse(*chunks: dict) -> bytes:
    events = [b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks]
    return b": keep-alive\n\n" + b"".join(events) + b"data: [DONE]\n\n"


def _delta(**d) -> dict:
    return {"choices": [{"index": 0, "delta": d}]}


THINKING = _sse(_delta(reasoning_content="Hm."), _delta(content="Paris"), _delta(content="."))


def _chat(body: bytes, seen: list) -> Chat:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(orjson.loads(request.content))
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    http = httpx.Client(base_url="http://mlxd", transport=httpx.MockTransport(answer))
    return Chat(http, "m", {"max_tokens": 8}, system="Be brief.")


@pytest.mark.parametrize("tty", [True, False])
def test_reasoning_is_dimmed_on_a_terminal_and_left_out_of_a_pipe(tty):
    seen: list = []
    chat = _chat(THINKING, seen)
    out = Tty() if tty else io.StringIO()
    assert chat.ask("Capital of France?", Printer(out)) == "Paris."
    text = out.getvalue()
    if tty:
        assert "\x1b[2mHm.\x1b[0m" in text and text.endswith("\n\nParis.\n")
    else:
        assert text == "Paris.\n"
    chat.ask("And Italy?", Printer(io.StringIO()))
    assert [m["role"] for m in seen[1]["messages"]] == ["system", "user", "assistant", "user"]
    assert seen[1]["messages"][2]["content"] == "Paris." and seen[1]["max_tokens"] == 8


def test_an_error_event_fails_the_turn_and_forgets_it():
    failing = _sse(_delta(content="Par"), {"error": {"message": "The model's worker crashed"}})
    chat = _chat(failing, [])
    with pytest.raises(CtlError, match="worker crashed"):
        chat.ask("Capital of France?", Printer(io.StringIO()))
    assert [m["role"] for m in chat.messages] == ["system"]
