"""Every mlxctl command against a running daemon (in process through main(), or as a process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from mlxd.supervisor.ctl import local as ctl_local
from mlxd.supervisor.ctl.mlxctl import main as mlxctl

from procs import free_port

MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture
def ctl(capsys):
    """ctl(d, *argv) -> (exit code, parsed --json output or text, stderr)."""

    def run(d, *argv: str, json_out: bool = True):
        code = mlxctl(
            ["--url", d.url, "--home", str(d.home), *argv, *(["--json"] if json_out else [])]
        )
        out, err = capsys.readouterr()
        body = json.loads(out) if json_out and code == 0 and out.strip() else out
        return code, body, err

    return run


def test_status_and_lifecycle_commands(make_daemon, ctl):
    d = make_daemon()
    code, models, _ = ctl(d, "models")
    assert code == 0 and {m["id"]: m["state"] for m in models} == {"a": "stopped", "b": "stopped"}
    assert ctl(d, "ps")[1] == []

    code, body, _ = ctl(d, "load", "a")
    assert code == 0 and body["result"] == "loaded" and body["model"]["state"] == "ready"
    pid = body["model"]["pid"]
    code, ps, _ = ctl(d, "ps")
    assert [(m["id"], m["state"], m["pid"]) for m in ps] == [("a", "ready", pid)]
    assert ps[0]["memory_bytes"] > 0
    code, table, _ = ctl(d, "ps", json_out=False)
    header, line = table.strip().splitlines()
    assert header.split()[:4] == ["MODEL", "STATE", "PID", "MEMORY"]
    assert line.split()[:3] == ["a", "ready", str(pid)] and "MiB" in line
    code, table, _ = ctl(d, "models", json_out=False)
    assert "SOURCE" in table and "home" in table and str(d.home) in table

    d.http.post("/v1/chat/completions", json={"model": "a", "messages": MSG, "max_tokens": 3})
    code, stats, _ = ctl(d, "stats")
    assert stats["supervisor"]["loads"] == 1
    assert stats["workers"]["a"]["body"]["generation_tokens"] == 3
    assert "GEN TOK" in ctl(d, "stats", json_out=False)[1]

    code, flush, _ = ctl(d, "flush")
    assert code == 0 and set(flush["flushed"]) | set(flush["unsupported"]) == {"a"}

    code, logs, _ = ctl(d, "logs", "a", "--tail", "3")
    assert code == 0 and len(logs["lines"]) == 3 and logs["file"] == "a.log"
    code, text, _ = ctl(d, "logs", "a", "--tail", "1000", json_out=False)
    assert "ready model=a" in text

    code, body, _ = ctl(d, "reload", "a")
    assert body["result"] == "reloaded" and body["model"]["generation"] == 1
    assert body["model"]["pid"] != pid

    code, body, _ = ctl(d, "drain", "a")
    assert body["result"] == "drained" and body["model"]["drained"] is True
    assert ctl(d, "ps")[1][0]["drained"] is True
    assert "(drained)" in ctl(d, "ps", json_out=False)[1]
    assert ctl(d, "load", "a")[1]["result"] == "loaded"
    code, text, _ = ctl(d, "unload", "a", json_out=False)
    assert code == 0 and text.startswith("a: unloaded in")
    assert ctl(d, "unload", "a")[1]["result"] == "not running"

    code, _, err = ctl(d, "load", "nope")
    assert code == 1 and err.strip() == "mlxctl: 404: The model 'nope' does not exist"


def test_failures_are_one_line_and_non_zero(make_daemon, ctl, tmp_path):
    class Gone:
        url, home = f"http://127.0.0.1:{free_port()}", tmp_path

    code, _, err = ctl(Gone, "ps")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"mlxctl: cannot reach mlxd at {Gone.url}")
    d = make_daemon(env={"MLXD_ADMIN_TOKEN": "t0k"})
    code, _, err = ctl(d, "ps")
    assert code == 1 and err.startswith("mlxctl: 401: ")
    code, ps, _ = ctl(d, "--token", "t0k", "ps")
    assert code == 0 and ps == []
    # The environment supplies the defaults when no flag does.
    p = subprocess.run(
        [sys.executable, "-m", "mlxd.supervisor.ctl.mlxctl", "models", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MLXD_URL": d.url, "MLXD_ADMIN_TOKEN": "t0k"},
    )
    assert p.returncode == 0, p.stderr
    assert [m["id"] for m in json.loads(p.stdout)] == ["a", "b"]


def test_logs_follow_prints_new_lines(make_daemon):
    d = make_daemon()
    d.http.post("/admin/models/a/load")
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlxd.supervisor.ctl.mlxctl",
            "--url",
            d.url,
            "logs",
            "a",
            "-f",
            "--tail",
            "1",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")))
    reader.start()
    try:
        # Its tail printed: it follows from that file offset, so the next line cannot be missed.
        d.wait_for(lambda: lines, 30, "the tail")
        d.http.post(
            "/v1/chat/completions",
            headers={"x-request-id": "follow-me"},
            json={"model": "a", "messages": MSG, "max_tokens": 2},
        )
        d.wait_for(lambda: any("follow-me" in ln for ln in lines), 15, "the followed line")
        d.http.post("/admin/models/a/reload")  # a new worker, a new log file: follow it
        d.http.post(
            "/v1/chat/completions",
            headers={"x-request-id": "after-reload"},
            json={"model": "a", "messages": MSG, "max_tokens": 2},
        )
        d.wait_for(lambda: any("after-reload" in ln for ln in lines), 15, "the new file")
        assert any(ln.startswith("==> a.g1.log <==") for ln in lines)
    finally:
        p.terminate()
        p.wait(10)
        reader.join(10)


def test_rm_refuses_a_loaded_model_and_deletes_only_home_folders(make_daemon, ctl, tiny_model_dir):
    d = make_daemon(models={"a": tiny_model_dir, "org/c": tiny_model_dir})
    d.http.post("/admin/models/a/load")
    code, _, err = ctl(d, "rm", "a")
    assert code == 1 and "'a' is ready; unload it first" in err
    assert (d.home / "models" / "a" / "config.json").is_file()
    code, body, _ = ctl(d, "rm", "org/c")
    assert code == 0 and body["removed"] == str(d.home / "models" / "org" / "c")
    assert not (d.home / "models" / "org").exists()
    assert [m["id"] for m in ctl(d, "models")[1]] == ["a"]
    code, _, err = ctl(d, "rm", "../a")
    assert code == 1 and "no model '../a'" in err
    ctl(d, "unload", "a")
    assert ctl(d, "rm", "a")[0] == 0 and not (d.home / "models" / "a").exists()


def test_import_gguf_runs_the_importer(make_daemon, ctl, monkeypatch, tmp_path):
    d = make_daemon(models={})
    seen = []

    def fake_run(argv, check):
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    code, _, _ = ctl(d, "import-gguf", str(tmp_path / "m.gguf"), "--id", "mine", json_out=False)
    assert code == 0
    assert seen == [
        [
            sys.executable,
            "-m",
            "mlxd.worker.importers.gguf",
            str(tmp_path / "m.gguf"),
            "--models-dir",
            str(d.home / "models"),
            "--id",
            "mine",
        ]
    ]
    assert ctl(d, "import-gguf", "m.gguf", "--overwrite", json_out=False)[0] == 0
    assert seen[-1][-1] == "--overwrite"  # accepted, and handed to the importer
    monkeypatch.undo()
    # The real importer, on a file that is not there: its one line and its exit status 2
    # (a bad file or argument) are mlxctl's, as docs/mlxctl.md says.
    missing = tmp_path / "missing.gguf"
    done = subprocess.run(
        [sys.executable, "-m", "mlxd.supervisor.ctl.mlxctl", "--home", str(d.home)]
        + ["import-gguf", str(missing)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: {missing}: cannot read (No such file or directory)"
    ]
    assert ctl_local.import_gguf_argv("f", d.home, None)[-2:] == ["--models-dir", str(d.home)]
