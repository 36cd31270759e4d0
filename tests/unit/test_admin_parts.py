"""Pieces of the admin/ops work without processes: log tails, auth rules, JSON logs, mlxctl pull
without a daemon."""

from __future__ import annotations

import json
import logging

from mlxd.shared.config import Settings
from mlxd.shared.logs import (
    ContextFilter,
    JsonFormatter,
    TextFormatter,
    bind_log_context,
    reset_log_context,
)
from mlxd.supervisor.admin import logtail
from mlxd.supervisor.ctl import tables as ctl_tables
from mlxd.supervisor.ctl.client import model_path
from mlxd.supervisor.ctl.mlxctl import main as mlxctl
from mlxd.supervisor.http.auth import bind_refusal, is_loopback_host, is_loopback_ip


def test_tail_and_follow(tmp_path):
    f = tmp_path / "w.log"
    assert logtail.tail(f, 5) == ([], 0)
    f.write_text("".join(f"line {i}\n" for i in range(20000)))
    lines, size = logtail.tail(f, 3)
    assert lines == ["line 19997", "line 19998", "line 19999"] and size == f.stat().st_size
    assert logtail.tail(f, 0)[0] == []
    with open(f, "a") as out:
        out.write("new 1\nhalf")
    lines, offset = logtail.read_after(f, size)
    assert lines == ["new 1"] and offset == size + 6  # the half line waits for its newline
    with open(f, "a") as out:
        out.write(" done\n")
    assert logtail.read_after(f, offset)[0] == ["half done"]
    f.write_text("rotated\n")  # shorter than the offset: read from the start
    assert logtail.read_after(f, offset) == (["rotated"], 8)


def test_loopback_rules_and_bind_refusal():
    assert is_loopback_ip("127.0.0.1") and is_loopback_ip("::1")
    assert is_loopback_ip("::ffff:127.0.0.1") and is_loopback_ip("127.8.9.10")
    assert not is_loopback_ip("192.168.1.2") and not is_loopback_ip(None)
    assert not is_loopback_ip("not an ip")
    assert is_loopback_host("localhost") and not is_loopback_host("0.0.0.0")
    assert bind_refusal(Settings(host="127.0.0.1")) is None
    assert bind_refusal(Settings(host="::1")) is None
    assert "needs an API key" in bind_refusal(Settings(host="0.0.0.0"))
    assert bind_refusal(Settings(host="0.0.0.0", api_key="k")) is None
    assert bind_refusal(Settings(host="0.0.0.0", insecure=True)) is None
    assert "needs an API key" in bind_refusal(Settings(host="0.0.0.0", api_key=""))
    assert "k" not in repr(Settings(api_key="k").api_key)  # secrets stay out of logs


def test_json_and_text_lines_carry_the_bound_request():
    record = logging.LogRecord("mlxd.x", logging.INFO, __file__, 1, "hello %s", ("you",), None)
    token = bind_log_context(request_id="r-1", model="org/m")
    try:
        ContextFilter().filter(record)
    finally:
        reset_log_context(token)
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "hello you" and line["level"] == "INFO" and line["logger"] == "mlxd.x"
    assert (line["request_id"], line["model"]) == ("r-1", "org/m")
    assert TextFormatter("%(message)s").format(record) == "hello you request_id=r-1 model=org/m"
    bare = logging.LogRecord("mlxd.x", logging.INFO, __file__, 1, "x", (), None)
    ContextFilter().filter(bare)  # nothing bound any more
    assert "request_id" not in json.loads(JsonFormatter().format(bare))


def test_mlxctl_pulls_by_itself_when_no_daemon_answers(tmp_path, monkeypatch, capsys):
    from mlxd.supervisor.ctl import pull as ctl_pull
    from mlxd.supervisor.store.hub import Manifest, RemoteFile

    class Hub:  # the hub's answers in memory (tests/e2e/test_model_store.py: a real one)
        def __init__(self, endpoint):
            assert endpoint == "http://hub.invalid"  # HF_ENDPOINT, passed on

        files = {"config.json": b"{}", "model.safetensors": b"\x02" + bytes(7) + b"{}"}

        def manifest(self, repo, revision):
            return Manifest(repo, "c", tuple(RemoteFile(n, len(d)) for n, d in self.files.items()))

        def fetch(self, repo, commit, file, part, on_bytes):
            part.write_bytes(self.files[file.name])
            on_bytes(file.size)

    monkeypatch.setattr(ctl_pull, "Hub", Hub)
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")
    args = ["--url", "http://127.0.0.1:9", "--home", str(tmp_path), "pull", "org/m", "--json"]
    assert mlxctl(args) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == {
        "model": "org/m",
        "repo": "org/m",
        "path": str(tmp_path / "models" / "org" / "m"),
    }
    assert "pulling config.json" in out.err and out.err.rstrip().endswith("success")
    assert mlxctl(["--url", "http://127.0.0.1:9", "pull", "nope:1b"]) == 1
    assert "not a name mlxd knows" in capsys.readouterr().err


def test_tables_and_paths():
    assert ctl_tables.size(512) == "512 B" and ctl_tables.size(3 << 20) == "3 MiB"
    assert ctl_tables.duration(5) == "5s" and ctl_tables.duration(125) == "2m05s"
    assert ctl_tables.duration(3700) == "1h01m"
    assert ctl_tables.table(["A", "LONG"], [["x", None], ["yyy", 2]]).splitlines() == [
        "A    LONG",
        "x    -",
        "yyy  2",
    ]
    assert model_path("org/m", "load") == "/admin/models/org/m/load"
    assert model_path("a b") == "/admin/models/a%20b"
