"""`mlxd service`: the plist, the systemd unit, and the commands each action runs (dry runs)."""

from __future__ import annotations

import os
import plistlib
import subprocess
import sys
from pathlib import Path

import pytest

from mlxd.supervisor import cli
from mlxd.supervisor.ctl import service
from mlxd.supervisor.ctl.service_files import (
    LABEL,
    TEMPLATE_SPEC,
    ServiceSpec,
    render_plist,
    render_unit,
)

ROOT = Path(__file__).resolve().parents[2]


def dry(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(["service", *argv, "--dry-run"])
    return code, capsys.readouterr().out


def written(out: str) -> str:
    """The file content a dry run prints between '# would write …:' and the commands."""
    body = out.split(":\n", 1)[1]
    return body[: body.index("# would run:")]


@pytest.fixture(autouse=True)
def user_home(tmp_path, monkeypatch):
    """A throwaway ~ so that nothing here can touch the real LaunchAgents or systemd folder."""
    home = tmp_path / "user"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def test_launchd_install_plist_and_commands(capsys, tmp_path, user_home):
    code, out = dry(capsys, "install", "--platform", "darwin", "--home", str(tmp_path))
    assert code == 0
    plist_path = Path.home() / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    assert out.startswith(f"# would write {plist_path}:\n")
    plist = plistlib.loads(written(out).encode())
    assert plist["Label"] == "com.mlxd.daemon"
    assert plist["RunAtLoad"] is True and plist["KeepAlive"] == {"SuccessfulExit": False}
    program = plist["ProgramArguments"]
    assert program[-1] == "start" and os.access(program[0], os.X_OK)
    assert plist["StandardOutPath"].startswith(f"{tmp_path}/logs/")
    assert plist["StandardErrorPath"].startswith(f"{tmp_path}/logs/")
    assert plist["EnvironmentVariables"]["MLXD_HOME"] == str(tmp_path)
    assert str(Path(sys.executable).parent) in plist["EnvironmentVariables"]["PATH"]
    uid = os.getuid()
    assert out.splitlines()[-3:] == [
        f"# would run: launchctl bootout gui/{uid}/com.mlxd.daemon",
        f"# would run: launchctl enable gui/{uid}/com.mlxd.daemon",
        f"# would run: launchctl bootstrap gui/{uid} {plist_path}",
    ]
    assert list(user_home.iterdir()) == [] and not (tmp_path / "logs").exists()  # wrote nothing


def test_launchd_uninstall_and_status(capsys):
    uid = os.getuid()
    code, out = dry(capsys, "uninstall", "--platform", "darwin")
    assert out.splitlines() == [
        f"# would run: launchctl bootout gui/{uid}/com.mlxd.daemon",
        f"# would remove {Path.home()}/Library/LaunchAgents/com.mlxd.daemon.plist",
    ]
    code, out = dry(capsys, "status", "--platform", "darwin")
    assert out.splitlines() == [f"# would run: launchctl print gui/{uid}/com.mlxd.daemon"]


def test_systemd_install_unit_and_commands(capsys, tmp_path):
    code, out = dry(capsys, "install", "--platform", "linux", "--home", str(tmp_path))
    assert code == 0
    unit_path = Path.home() / ".config" / "systemd" / "user" / "mlxd.service"
    assert out.startswith(f"# would write {unit_path}:\n")
    unit = written(out)
    lines = set(unit.splitlines())
    assert {
        "Restart=on-failure",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        f"ReadWritePaths={tmp_path}",
        "KillMode=mixed",
        "WantedBy=default.target",
    } <= lines
    exec_start = next(ln for ln in lines if ln.startswith("ExecStart="))
    assert exec_start.endswith(" start") and Path(exec_start[10:].split()[0]).is_file()
    assert f"Environment=MLXD_HOME={tmp_path} PYTHONUNBUFFERED=1" in lines
    assert out.splitlines()[-2:] == [
        "# would run: systemctl --user daemon-reload",
        "# would run: systemctl --user enable --now mlxd.service",
    ]
    code, out = dry(capsys, "uninstall", "--platform", "linux")
    assert out.splitlines() == [
        "# would run: systemctl --user disable --now mlxd.service",
        f"# would remove {unit_path}",
        "# would run: systemctl --user daemon-reload",
    ]


def test_execute_writes_runs_in_order_and_stops_on_failure(tmp_path):
    spec = ServiceSpec(program=("/opt/mlxd", "start"), home=str(tmp_path / "home"))
    ran: list[list[str]] = []

    def ok(argv, check):
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 0)

    p = service.plan("install", "systemd", spec, tmp_path, 501)
    assert service.execute(p, dry_run=False, run=ok, out=open(os.devnull, "w")) == 0
    assert p.file.read_text() == render_unit(spec)
    assert ran == [
        ["systemctl", "--user", "daemon-reload"],
        ["systemctl", "--user", "enable", "--now", "mlxd.service"],
    ]

    def fail(argv, check):
        return subprocess.CompletedProcess(argv, 1)

    p = service.plan("uninstall", "systemd", spec, tmp_path, 501)
    # `disable` may fail (it was never enabled); a failing daemon-reload is an error.
    assert service.execute(p, dry_run=False, run=fail, out=open(os.devnull, "w")) == 1
    assert not p.file.exists()
    p = service.plan("install", "launchd", spec, tmp_path, 501)
    assert service.execute(p, dry_run=False, run=ok, out=open(os.devnull, "w")) == 0
    assert plistlib.loads(p.file.read_bytes())["ProgramArguments"] == ["/opt/mlxd", "start"]


def test_program_prefers_the_mlxd_script_beside_python(tmp_path):
    (tmp_path / "mlxd").write_text("#!/bin/sh\n")
    python = str(tmp_path / "python")
    assert service.program(python, "/usr/bin/mlxd") == (str(tmp_path / "mlxd"), "start")
    assert service.program("/nowhere/python", "/usr/bin/mlxd") == ("/usr/bin/mlxd", "start")
    assert service.program("/nowhere/python", None) == (
        "/nowhere/python",
        "-m",
        "mlxd.supervisor",
        "start",
    )


def test_unsupported_platform_and_deploy_templates_in_sync():
    with pytest.raises(ValueError, match="not win32"):
        service.platform_kind("win32")
    # deploy/ is service_files rendered with placeholders; regenerate with write_templates.
    assert (ROOT / "deploy" / f"{LABEL}.plist").read_bytes() == render_plist(TEMPLATE_SPEC)
    assert (ROOT / "deploy" / "mlxd.service").read_text() == render_unit(TEMPLATE_SPEC)
