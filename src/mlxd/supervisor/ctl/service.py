"""`mlxd service install | uninstall | status`: run mlxd at login under launchd or systemd.

Each action is a Plan (a file to write or remove, then commands); `--dry-run` prints the plan
and runs nothing. macOS: a LaunchAgent in ~/Library/LaunchAgents, loaded with
`launchctl bootstrap gui/$UID`. Linux: a user unit in ~/.config/systemd/user, enabled with
`systemctl --user enable --now`.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from mlxd.supervisor.ctl.service_files import (
    LABEL,
    UNIT_NAME,
    ServiceSpec,
    render_plist,
    render_unit,
)


@dataclass
class Step:
    argv: list[str]
    must_succeed: bool = True  # False: "not loaded" / "not enabled" answers are fine


@dataclass
class Plan:
    """What one action does: commands, write or remove one file, then more commands."""

    action: str
    file: Path
    content: bytes | None = None  # the file to write (install)
    remove: bool = False  # remove the file (uninstall)
    before: list[Step] = field(default_factory=list)  # run before the file changes
    steps: list[Step] = field(default_factory=list)  # run after


def platform_kind(platform: str) -> str:
    if platform == "darwin":
        return "launchd"
    if platform.startswith("linux"):
        return "systemd"
    raise ValueError(
        f"services are supported on macOS (launchd) and Linux (systemd), not {platform}"
    )


def program(python: str, which_mlxd: str | None) -> tuple[str, ...]:
    """The command the service runs: the mlxd script beside this interpreter, else python -m."""
    beside = Path(python).parent / "mlxd"
    if beside.is_file():
        return (str(beside), "start")
    if which_mlxd:
        return (which_mlxd, "start")
    return (python, "-m", "mlxd.supervisor", "start")


def plan(action: str, kind: str, spec: ServiceSpec, user_home: Path, uid: int) -> Plan:
    """The Plan for `action` (install, uninstall, status) under `kind` (launchd, systemd)."""
    if kind == "launchd":
        file = user_home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
        target = f"gui/{uid}/{LABEL}"
        if action == "install":
            return Plan(
                action,
                file,
                render_plist(spec),
                steps=[
                    Step(["launchctl", "bootout", target], must_succeed=False),  # an older copy
                    Step(["launchctl", "enable", target]),
                    Step(["launchctl", "bootstrap", f"gui/{uid}", str(file)]),
                ],
            )
        if action == "uninstall":
            return Plan(
                action,
                file,
                remove=True,
                before=[Step(["launchctl", "bootout", target], must_succeed=False)],
            )
        return Plan(action, file, steps=[Step(["launchctl", "print", target])])
    file = user_home / ".config" / "systemd" / "user" / UNIT_NAME
    ctl = ["systemctl", "--user"]
    if action == "install":
        return Plan(
            action,
            file,
            render_unit(spec).encode(),
            steps=[Step([*ctl, "daemon-reload"]), Step([*ctl, "enable", "--now", UNIT_NAME])],
        )
    if action == "uninstall":
        return Plan(
            action,
            file,
            remove=True,
            before=[Step([*ctl, "disable", "--now", UNIT_NAME], must_succeed=False)],
            steps=[Step([*ctl, "daemon-reload"])],
        )
    return Plan(action, file, steps=[Step([*ctl, "status", "--no-pager", UNIT_NAME])])


def execute(p: Plan, *, dry_run: bool, out: TextIO | None = None, run=None) -> int:
    """Carry out (or, dry, print) the plan; returns the exit code."""
    out, run = out or sys.stdout, run or subprocess.run
    if not _run_steps(p, p.before, dry_run, out, run):
        return 1
    if p.content is not None:
        if dry_run:
            text = p.content.decode()
            out.write(f"# would write {p.file}:\n{text}")
            if not text.endswith("\n"):
                out.write("\n")
        else:
            p.file.parent.mkdir(parents=True, exist_ok=True)
            p.file.write_bytes(p.content)
            out.write(f"wrote {p.file}\n")
    if p.remove:
        if dry_run:
            out.write(f"# would remove {p.file}\n")
        elif p.file.exists():
            p.file.unlink()
            out.write(f"removed {p.file}\n")
        else:
            out.write(f"{p.file} was not installed\n")
    return 0 if _run_steps(p, p.steps, dry_run, out, run) else 1


def _run_steps(p: Plan, steps: list[Step], dry_run: bool, out: TextIO, run) -> bool:
    for step in steps:
        cmd = shlex.join(step.argv)
        if dry_run:
            out.write(f"# would run: {cmd}\n")
            continue
        out.write(f"$ {cmd}\n")
        out.flush()
        try:
            code = run(step.argv, check=False).returncode
        except FileNotFoundError:
            code = 127
        if code != 0 and step.must_succeed:
            print(f"mlxd service {p.action}: `{cmd}` failed with exit code {code}", file=sys.stderr)
            return False
    return True
