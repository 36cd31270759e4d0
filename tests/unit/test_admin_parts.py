"""Pieces of the admin/ops work without processes: log tails, auth rules, JSON logs, mlxctl pull."""

from __future__ import annotations

import json
import logging
import os

import pytest

from mlxd.shared.config import Settings
from mlxd.shared.logs import (
    ContextFilter,
    JsonFormatter,
    TextFormatter,
    bind_log_context,
    reset_log_context,
)
from mlxd.supervisor.admin import logtail
from mlxd.supervisor.ctl import local as ctl_local
from mlxd.supervisor.ctl import tables as ctl_tables
from mlxd.supervisor.ctl.client import CtlError, model_path
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


def test_pull_downloads_then_moves_into_place(tmp_path):
    calls = []

    def fake_download(repo_id, revision, local_dir, allow_patterns):
        calls.append((repo_id, revision, allow_patterns))
        os.makedirs(f"{local_dir}/.cache/huggingface", exist_ok=True)
        for name in ("config.json", "tokenizer.json"):
            with open(f"{local_dir}/{name}", "w") as f:
                f.write("{}")
        with open(f"{local_dir}/model.safetensors", "wb") as f:
            f.write(b"weights-%d" % len(calls))

    models = tmp_path / "models"
    dest = ctl_local.pull("org/name", models, download=fake_download)
    assert dest == models / "org" / "name"
    assert sorted(p.name for p in dest.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    repo, revision, patterns = calls[0]
    assert (repo, revision) == ("org/name", None)
    assert {"*.json", "*.safetensors", "tokenizer*"} <= set(patterns)
    ctl_local.pull("org/name", models, "v2", download=fake_download)  # a second pull replaces
    assert (dest / "model.safetensors").read_bytes() == b"weights-2"
    assert [p.name for p in models.iterdir() if p.name.startswith(".trash")] == []

    def empty(**kw):
        pass

    with pytest.raises(CtlError, match="no config.json"):
        ctl_local.pull("org/empty", models, download=empty)
    for bad in ("../x", "org/../x", "/abs", "a/b/c", ""):
        with pytest.raises(CtlError, match="not a Hugging Face repository id"):
            ctl_local.pull(bad, models, download=fake_download)


def test_failed_pull_leaves_no_download_behind(tmp_path):
    models = tmp_path / "models"

    def half_then_fail(repo_id, revision, local_dir, allow_patterns):
        with open(f"{local_dir}/model.safetensors", "wb") as f:
            f.write(b"partial")
        raise OSError("connection reset\nmore detail")

    def interrupted(**kw):
        raise KeyboardInterrupt

    with pytest.raises(CtlError, match="^cannot download org/x: connection reset$"):
        ctl_local.pull("org/x", models, download=half_then_fail)
    with pytest.raises(CtlError, match="no config.json"):
        ctl_local.pull("org/y", models, download=lambda **kw: None)
    with pytest.raises(KeyboardInterrupt):
        ctl_local.pull("org/z", models, download=interrupted)
    assert list(models.iterdir()) == []  # no .downloads/<name>/, no .downloads/
    # a pull under way keeps its own staging folder when another one fails
    (models / ".downloads" / "org--other").mkdir(parents=True)
    with pytest.raises(CtlError):
        ctl_local.pull("org/x", models, download=half_then_fail)
    assert [p.name for p in (models / ".downloads").iterdir()] == ["org--other"]


def test_pull_through_main_with_the_hub_stubbed(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    def fake(repo_id, revision, local_dir, allow_patterns):
        with open(f"{local_dir}/config.json", "w") as f:
            f.write("{}")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    assert mlxctl(["--home", str(tmp_path), "pull", "org/m", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"repo": "org/m", "path": str(tmp_path / "models" / "org" / "m")}


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
