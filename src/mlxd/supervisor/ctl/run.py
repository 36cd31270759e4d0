"""`mlxctl run MODEL [PROMPT]`: one streamed answer, or an interactive chat (docs/mlxctl.md).

Both go through the daemon's /v1/chat/completions stream, as any client does. In the chat the
history is kept across turns; Ctrl-C stops the reply being written (closing the stream cancels
it in the worker) and forgets that turn; Ctrl-D or /bye leaves. Reasoning is shown dimmed on a
terminal and left out when stdout is a pipe or a file, which then gets only the answer.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO, Any
from urllib.parse import quote

import httpx
import orjson
from rich.console import Console

from mlxd.supervisor.ctl.client import CtlError, error_message, unreachable

PROMPT = ">>> "
HELP = "/bye or Ctrl-D leaves, /clear forgets the conversation, Ctrl-C stops a reply"
EXIT_INTERRUPTED = 130


class Printer:
    """Writes a reply as it streams: reasoning dimmed (on a terminal only), then the answer."""

    def __init__(self, file: IO[str] | None = None, verbose: bool = False):
        self.file = file or sys.stdout
        self.tty = self.file.isatty()
        # rich writes styles only to a terminal (and honours NO_COLOR); out() never wraps.
        self.console = Console(
            file=self.file, force_terminal=self.tty or None, highlight=False, soft_wrap=True
        )
        self.verbose = verbose
        self._reasoning = False

    def _write(self, text: str, style: str | None = None) -> None:
        self.console.out(text, style=style, end="", highlight=False)
        self.file.flush()

    def reasoning(self, text: str) -> None:
        if self.tty:
            self._write(text, "dim")
            self._reasoning = True

    def answer(self, text: str) -> None:
        if self._reasoning:  # a blank line between the thinking and the answer
            self._write("\n\n")
            self._reasoning = False
        self._write(text)

    def end(self, note: str | None = None) -> None:
        self._reasoning = False
        self._write("\n")
        if note:
            self._write(note + "\n", "dim")

    def usage(self, usage: dict[str, Any] | None, decode_s: float) -> None:
        """With --verbose, the reply's token counts and speed, dimmed on stderr."""
        if not self.verbose or not usage:
            return
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        answer = usage.get("completion_tokens", 0)
        rate = f", {answer / decode_s:.1f} tokens/s" if decode_s > 0 else ""
        line = f"prompt: {usage.get('prompt_tokens', 0)} tokens ({cached} cached), "
        Console(stderr=True, highlight=False).print(
            line + f"answer: {answer} tokens{rate}", style="dim", markup=False
        )


def _stream(http: httpx.Client, body: dict[str, Any], printer: Printer) -> str:
    """POST one streamed chat completion, print it as it comes; returns the answer text."""
    parts: list[str] = []
    usage: dict[str, Any] | None = None
    first = None
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code >= 400:
            r.read()
            raise CtlError(f"{r.status_code}: {error_message(r)}")
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue  # comments, heartbeats, blank separators
            data = line[5:].strip()
            if data == "[DONE]":
                break
            try:
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError:
                raise CtlError("the daemon sent a malformed stream line") from None
            if isinstance(chunk.get("error"), dict):  # the worker failed mid-stream
                raise CtlError(chunk["error"].get("message") or "the reply failed")
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                first = first or time.monotonic()
                if delta.get("reasoning_content"):
                    printer.reasoning(delta["reasoning_content"])
                if delta.get("content"):
                    parts.append(delta["content"])
                    printer.answer(delta["content"])
    printer.end()
    printer.usage(usage, time.monotonic() - first if first else 0.0)
    return "".join(parts)


class Chat:
    """One conversation with one model: the messages so far and the request options."""

    def __init__(
        self,
        http: httpx.Client,
        model: str,
        options: dict[str, Any],
        system: str | None = None,
        source: str | None = None,
    ):
        self.http = http
        self.model = model
        self.options = options
        self.system = system
        self.source = source  # what chose the daemon, named when it does not answer
        self.messages: list[dict[str, str]] = []
        self.clear()

    def clear(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def check(self) -> None:
        """Fail early, in one line, when the daemon does not answer or lacks the model."""
        r = self._call(lambda: self.http.get(f"/v1/models/{quote(self.model, safe='/')}"))
        if r.status_code >= 400:
            raise CtlError(f"{r.status_code}: {error_message(r)}")

    def ask(self, prompt: str, printer: Printer) -> str:
        """Send `prompt` with the history; the turn is kept only if its answer completed."""
        self.messages.append({"role": "user", "content": prompt})
        body = {
            "model": self.model,
            "messages": self.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.options,
        }
        try:
            answer = self._call(lambda: _stream(self.http, body, printer))
        except BaseException:  # Ctrl-C or a failure: the turn did not happen
            self.messages.pop()
            raise
        self.messages.append({"role": "assistant", "content": answer})
        return answer

    def _call(self, fn: Callable[[], Any]) -> Any:
        url = str(self.http.base_url).rstrip("/")
        try:
            return fn()
        except httpx.ConnectError:
            raise CtlError(unreachable(url, self.source)) from None
        except httpx.TimeoutException:
            raise CtlError(f"mlxd at {url} did not answer in time") from None
        except httpx.HTTPError as exc:
            raise CtlError(f"request to {url} failed: {exc}") from None


def repl(chat: Chat, printer: Printer, read: Callable[[str], str] = input) -> int:
    """The interactive chat; returns the exit code (0 when left with Ctrl-D or /bye)."""
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:  # pragma: no cover
        pass
    printer.console.print(f"chatting with {chat.model}; {HELP}", style="dim", markup=False)
    while True:
        try:
            text = read(PROMPT).strip()
        except EOFError:
            printer.end()
            return 0
        except KeyboardInterrupt:
            printer.end("(Ctrl-D or /bye leaves)")
            continue
        if not text:
            continue
        if text in ("/bye", "/exit", "/quit"):
            return 0
        if text == "/clear":
            chat.clear()
            printer.console.print("(conversation cleared)", style="dim")
            continue
        if text.startswith("/"):
            printer.console.print(HELP, style="dim", markup=False)
            continue
        try:
            chat.ask(text, printer)
        except KeyboardInterrupt:
            printer.end("(stopped)")
        except CtlError as exc:
            printer.end()
            print(f"mlxctl: {exc}", file=sys.stderr, flush=True)


def run(
    http: httpx.Client,
    model: str,
    prompt: str | None,
    options: dict[str, Any],
    system: str | None = None,
    source: str | None = None,
    verbose: bool = False,
) -> int:
    """`mlxctl run`: with a prompt (or piped input) one answer, else the interactive chat."""
    chat = Chat(http, model, options, system, source)
    chat.check()
    printer = Printer(verbose=verbose)
    if prompt is None and not sys.stdin.isatty():
        prompt = sys.stdin.read()
        if not prompt.strip():
            raise CtlError("nothing to ask: the piped input is empty")
    if prompt is None:
        return repl(chat, printer)
    try:
        chat.ask(prompt, printer)
    except KeyboardInterrupt:
        printer.end()
        return EXIT_INTERRUPTED
    return 0
