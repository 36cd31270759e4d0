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


def test_run_takes_its_prompt_after_its_options():
    """Found by a black-box probe (2026-12-07): `mlxctl run tiny --max-tokens 5 hi` was
    "unrecognized arguments: hi" (argparse fills the optional PROMPT before the options)."""
    from mlxd.supervisor.ctl.mlxctl import parse

    args = parse(["run", "tiny", "--max-tokens", "5", "hello there"])
    assert (args.model, args.max_tokens, args.prompt) == ("tiny", 5, "hello there")
    assert parse(["run", "tiny", "--verbose", "hello", "there"]).prompt == "hello there"
    assert parse(["run", "tiny", "hi", "--max-tokens", "5"]).prompt == "hi"
    assert parse(["run", "tiny"]).prompt is None
    assert parse(["run", "tiny", "hello", "world"]).prompt == "hello world"  # a review's case


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--timeout", "-1", "ps"], "above 0"),
        (["--timeout", "0", "ps"], "above 0"),
        (["--timeout", "nan", "ps"], "above 0"),
        (["--timeout", "soon", "ps"], "not a number"),
        (["--timeout", "1e10", "ps"], "at most"),  # a traceback in socket.settimeout
        (["run", "tiny", "hi", "--verb"], "unrecognized arguments: --verb"),  # not --verbose
        (["unload", "tiny", "--all"], "not both"),
        (["run", "tiny", "hi", "--bogus"], "unrecognized arguments: --bogus"),
        (["ps", "extra"], "unrecognized arguments: extra"),
    ],
)
def test_usage_mistakes_are_one_line_and_exit_2(argv, says, capsys):
    """--timeout -1 and nan were tracebacks, 0 "cannot reach mlxd"; `unload tiny --all`
    unloaded every model (a probe, 2026-12-07)."""
    from mlxd.supervisor.ctl.mlxctl import parse

    with pytest.raises(SystemExit) as done:
        parse(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and says in err and len(err.strip().splitlines()) == 1, err
