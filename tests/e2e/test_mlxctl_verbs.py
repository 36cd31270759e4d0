"""mlxctl against one real daemon: how it finds the daemon, `show`, aliases, `--version`, and
`run` (one answer; an interactive chat through a pseudo-terminal)."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlxd.supervisor.ctl.mlxctl import main as mlxctl

from procs import free_port

DISCOVERY_ENV = ("MLXD_URL", "MLXD_HOST", "MLXD_PORT", "MLXD_HOME")
CONFIG = "[models.a]\nbatch = 4\nkeep_alive_s = 120\n"
# A daemon whose replies never come by themselves (the first token is held back for longer
# than any test runs): only the client's Ctrl-C ends one, however slow the machine.
HELD = {"MLXD_DEBUG_PREFILL_DELAY_S": "3600"}


@pytest.fixture(scope="module")
def daemon(make_module_daemon, tiny_model_dir):
    return make_module_daemon(models={"a": tiny_model_dir}, config=CONFIG)


@pytest.fixture
def ctl(capsys, monkeypatch):
    """ctl(*argv, **env) -> (exit code, stdout, stderr) of mlxctl in process, with only the
    given discovery variables set."""
    for name in DISCOVERY_ENV:
        monkeypatch.delenv(name, raising=False)

    def run(*argv: str, **env: str):
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            code = mlxctl(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def test_discovery_order(daemon, ctl, tmp_path):
    home = str(daemon.home)
    assert (daemon.home / "run" / "mlxd.url").read_text().strip() == daemon.url
    dead = _dead_url()
    dead_port = dead.rsplit(":", 1)[1]

    # The home's URL file: no flag, no variable needed.
    code, out, err = ctl("--home", home, "ps")
    assert code == 0 and out.startswith("MODEL")
    version = daemon.http.get("/health").json()["version"]
    assert err.strip() == f"mlxd {version} at {daemon.url} (from {home}/run/mlxd.url)"
    # $MLXD_PORT wins over the URL file: the wrong daemon is never asked silently.
    code, _, err = ctl("--home", home, "ps", MLXD_PORT=dead_port)
    assert code == 1 and err.strip().splitlines() == [
        f"mlxctl: cannot reach mlxd at {dead} (from $MLXD_PORT): is it running? "
        "start it with `mlxd start`"
    ]
    # $MLXD_URL wins over $MLXD_PORT, --url over $MLXD_URL.
    code, _, err = ctl("--home", home, "ps", MLXD_URL=daemon.url, MLXD_PORT=dead_port)
    assert code == 0 and "(from $MLXD_URL)" in err
    code, _, err = ctl("--home", home, "--url", dead, "ps", MLXD_URL=daemon.url)
    assert code == 1 and f"at {dead} (from --url)" in err

    # Another home: its config.toml's port when it has no URL file ...
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.toml").write_text(f"port = {daemon.port}\n")
    code, _, err = ctl("--home", str(other), "ps")
    assert code == 0 and f"{daemon.url} (from {other}/config.toml)" in err
    # ... $MLXD_HOST takes the port from that config, as the daemon itself would ...
    code, _, err = ctl("ps", MLXD_HOME=str(other), MLXD_HOST="127.0.0.1")
    assert code == 0 and f"{daemon.url} (from $MLXD_HOST)" in err
    # ... and a URL file there beats the config.
    (other / "run").mkdir()
    (other / "run" / "mlxd.url").write_text(dead + "\n")
    code, _, err = ctl("--home", str(other), "ps")
    assert code == 1 and f"at {dead} (from {other}/run/mlxd.url)" in err
    code, _, err = ctl("--home", str(other), "ps", MLXD_PORT="http")
    assert code == 1 and err.strip() == "mlxctl: $MLXD_PORT is 'http', not a port number"


def test_url_file_is_removed_on_a_clean_exit(make_daemon, tiny_model_dir):
    d = make_daemon(models={"a": tiny_model_dir})
    url_file = d.home / "run" / "mlxd.url"
    assert url_file.read_text() == d.url + "\n"
    assert d.stop() == 0 and not url_file.exists()


def test_version_everywhere(daemon, ctl):
    version = daemon.http.get("/health").json()["version"]
    assert version and version[0].isdigit()
    for prog, module in (("mlxd", "mlxd.supervisor"), ("mlxctl", "mlxd.supervisor.ctl.mlxctl")):
        p = subprocess.run(
            [sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60
        )
        assert p.returncode == 0 and p.stdout.strip() == f"{prog} {version}"


def test_show_aliases_and_unload_all(daemon, ctl):
    url = ["--url", daemon.url]
    code, out, _ = ctl(*url, "show", "a", "--json")
    shown = json.loads(out)
    assert code == 0 and shown["id"] == "a" and shown["path"] == str(daemon.home / "models" / "a")
    assert shown["weights_bytes"] > 0 and shown["state"] in ("stopped", "ready")
    assert shown["settings"]["batch"] == 4 and shown["settings"]["keep_alive_s"] == 120
    assert shown["architecture"]["model_type"] == "llama"
    assert shown["architecture"]["context_length"] > 0
    code, text, _ = ctl(*url, "show", "a")
    assert code == 0 and f"path       {shown['path']}" in text and "  batch " in text
    code, _, err = ctl(*url, "show", "nope")
    assert code == 1 and err == "mlxctl: 404: The model 'nope' does not exist\n"

    assert json.loads(ctl(*url, "ls", "--json")[1]) == json.loads(ctl(*url, "models", "--json")[1])
    assert json.loads(ctl(*url, "load", "a", "--json")[1])["model"]["state"] == "ready"
    code, out, _ = ctl(*url, "stop", "--all", "--json")
    assert code == 0 and [(b["id"], b["result"]) for b in json.loads(out)] == [("a", "unloaded")]
    assert ctl(*url, "unload", "--all")[1].strip() == "no model is loaded"
    code, _, err = ctl(*url, "unload")
    assert code == 1 and err == "mlxctl: name the model to unload, or pass --all\n"
    code, _, err = ctl(*url, "stop", "nope")
    assert code == 1 and err == "mlxctl: 404: The model 'nope' does not exist\n"


def _mlxctl_argv(daemon, *args: str) -> list[str]:
    return [sys.executable, "-m", "mlxd.supervisor.ctl.mlxctl", "--url", daemon.url, *args]


def test_run_with_a_prompt_prints_the_answer(daemon):
    greedy = ["--max-tokens", "6", "--temperature", "0"]
    p = subprocess.run(
        _mlxctl_argv(daemon, "run", "a", "Say hi", *greedy),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    r = daemon.openai().chat.completions.create(
        model="a",
        messages=[{"role": "user", "content": "Say hi"}],
        max_tokens=6,
        temperature=0,
    )
    assert p.stdout == r.choices[0].message.content + "\n" and "\x1b" not in p.stdout
    p = subprocess.run(
        _mlxctl_argv(daemon, "run", "nope", "Say hi"), capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 1 and p.stderr == "mlxctl: 404: The model 'nope' does not exist\n"


class Terminal:
    """mlxctl in a pseudo-terminal: send keys, wait for output."""

    def __init__(self, argv: list[str]):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: mlxctl with the pty as its controlling terminal
            # As a login terminal starts it: a test run launched in the background (`make
            # test &`) ignores SIGINT, and an exec'd Python would keep ignoring Ctrl-C.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execv(argv[0], argv)
        self.out = b""
        self.seen = 0
        self.code: int | None = None

    def send(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def expect(self, text: bytes, timeout_s: float = 60.0) -> bytes:
        """Wait for `text` after what was already expected; returns the output up to it."""
        deadline = time.monotonic() + timeout_s
        while (at := self.out.find(text, self.seen)) < 0:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} in {self.out[self.seen :]!r}")
            if select.select([self.fd], [], [], 0.2)[0]:
                try:
                    self.out += os.read(self.fd, 4096)
                except OSError:  # the child closed the terminal
                    time.sleep(0.1)
        before, self.seen = self.out[self.seen : at], at + len(text)
        return before

    def wait_reading(self, timeout_s: float = 60.0) -> None:
        """Wait until mlxctl sleeps in select() on the terminal, so a key sent next reaches
        readline: a SIGINT or an EOF that lands between the prompt's output and that select()
        is held until the next line (a readline race, not mlxctl's), and the test would hang.
        Linux shows it in /proc; elsewhere this returns at once."""
        wchan = Path(f"/proc/{self.pid}/wchan")
        deadline = time.monotonic() + timeout_s
        while wchan.exists() and not any(w in wchan.read_text() for w in ("select", "poll")):
            if time.monotonic() > deadline:
                raise AssertionError(f"mlxctl is not reading the terminal: {wchan.read_text()}")
            time.sleep(0.01)

    def wait(self, timeout_s: float = 30.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                self.code = os.waitstatus_to_exitcode(status)
                return self.code
            try:
                if select.select([self.fd], [], [], 0.1)[0]:
                    self.out += os.read(self.fd, 4096)
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"mlxctl did not exit: {self.out[-500:]!r}")

    def close(self) -> None:
        """Kill it if it is still there (a failed test)."""
        if self.code is None:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
            os.close(self.fd)


def _prompt_tokens(term: Terminal) -> int:
    """The prompt size `run --verbose` prints after an answer."""
    line = term.expect(b" tokens (").rsplit(b"prompt: ", 1)[1]
    term.expect(b">>> ")
    return int(line)


def test_interactive_run_keeps_history_and_ctrl_c_stops_a_reply(
    daemon, make_daemon, tiny_model_dir
):
    argv = _mlxctl_argv(daemon, "run", "a", "--max-tokens", "3", "--verbose")
    term = Terminal(argv)
    try:
        term.expect(b">>> ")
        term.send(b"hello\r")
        first = _prompt_tokens(term)
        term.send(b"hello\r")  # the same words: only the history makes this prompt longer
        assert _prompt_tokens(term) > first + 3
        term.wait_reading()
        term.send(b"\x03")  # at the prompt Ctrl-C does not leave
        term.expect(b"(Ctrl-D or /bye leaves)")
        term.expect(b">>> ")
        term.wait_reading()
        term.send(b"\x04")  # Ctrl-D does
        assert term.wait() == 0
    finally:
        term.close()

    held = make_daemon(models={"a": tiny_model_dir}, config=CONFIG, env=HELD)
    term = Terminal(_mlxctl_argv(held, "run", "a", "--max-tokens", "3"))
    try:
        term.expect(b">>> ")
        term.send(b"tell me more\r")
        term.expect(b"tell me more")
        # The request is in (a lease is held) and its reply cannot end before Ctrl-C does.
        held.wait_for(lambda: _leases(held) == 1, 120, "the request")
        term.send(b"\x03")
        assert term.expect(b"(stopped)").replace(b"\x1b[2m", b"").strip() == b"^C"
        term.expect(b">>> ")
        # The stream was closed, so the worker gave up the request (and logged it so).
        log = held.home / "logs" / "a.log"
        held.wait_for(lambda: " 499 " in log.read_text(), 60, "the cancel")
        held.wait_for(lambda: _leases(held) == 0, 60, "the lease's release")
        term.send(b"/bye\r")
        assert term.wait() == 0
    finally:
        term.close()


def _leases(daemon) -> int:
    rows = daemon.http.get("/admin/models").json()["data"]
    return next(m["leases"] for m in rows if m["id"] == "a")


@pytest.fixture(autouse=True)
def _no_home_leak(monkeypatch, tmp_path):
    # mlxctl must never fall back to the user's own ~/.mlxd in these tests.
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    Path(tmp_path / "user").mkdir()
