"""The launchd plist and the systemd user unit that run `mlxd start` as a service.

This module is their source: deploy/ holds the same files rendered with @PLACEHOLDERS@ for
people who install by hand (tests keep the two in sync; `write_templates` regenerates them).
"""

from __future__ import annotations

import plistlib
from dataclasses import dataclass
from pathlib import Path

LABEL = "com.mlxd.daemon"
UNIT_NAME = "mlxd.service"
# Supervisor shutdown (grace) + worker drain + two-phase stop, with room to spare.
STOP_TIMEOUT_S = 120


@dataclass(frozen=True)
class ServiceSpec:
    """What both service files need: the command, the state folder, and a PATH."""

    program: tuple[str, ...]  # the mlxd executable (or python -m mlxd.supervisor) and "start"
    home: str  # $MLXD_HOME
    path_env: str = "/usr/local/bin:/opt/homebrew/bin:/usr/bin:/bin"

    @property
    def logs_dir(self) -> str:
        return f"{self.home.rstrip('/')}/logs"


TEMPLATE_SPEC = ServiceSpec(program=("@MLXD_BIN@", "start"), home="@MLXD_HOME@", path_env="@PATH@")


def render_plist(spec: ServiceSpec) -> bytes:
    """A launchd agent: started at login, restarted when it fails, logs under $MLXD_HOME/logs."""
    return plistlib.dumps(
        {
            "Label": LABEL,
            "ProgramArguments": list(spec.program),
            "EnvironmentVariables": {
                "MLXD_HOME": spec.home,
                "PATH": spec.path_env,
                "PYTHONUNBUFFERED": "1",
            },
            "RunAtLoad": True,
            # Restart after a crash, not after a clean `mlxd` exit (SIGTERM from bootout).
            "KeepAlive": {"SuccessfulExit": False},
            "ThrottleInterval": 10,
            "ExitTimeOut": STOP_TIMEOUT_S,
            "WorkingDirectory": spec.home,
            "StandardOutPath": f"{spec.logs_dir}/mlxd.stdout.log",
            "StandardErrorPath": f"{spec.logs_dir}/mlxd.stderr.log",
            "ProcessType": "Interactive",  # no background throttling of a latency-bound server
        }
    )


def systemd_quote(arg: str) -> str:
    """Quote one word for ExecStart=/Environment= (systemd.syntax: "…", %% and $$)."""
    out = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{out}"' if any(c in out for c in " \t\"\\'") or not out else out


def render_unit(spec: ServiceSpec) -> str:
    """A systemd user unit with the sandboxing an unprivileged user manager can apply."""
    exec_start = " ".join(systemd_quote(a) for a in spec.program)
    env = " ".join(systemd_quote(kv) for kv in (f"MLXD_HOME={spec.home}", "PYTHONUNBUFFERED=1"))
    return f"""\
[Unit]
Description=mlxd: local LLM serving daemon on MLX

[Service]
Type=exec
ExecStart={exec_start}
Environment={env}
Restart=on-failure
RestartSec=5
# SIGTERM goes to the supervisor only: it drains and stops its workers itself.
KillMode=mixed
TimeoutStopSec={STOP_TIMEOUT_S}
UMask=0077
NoNewPrivileges=yes
PrivateTmp=yes
ProtectSystem=strict
ProtectHome=read-only
ReadWritePaths={systemd_quote(spec.home)}
ProtectKernelTunables=yes
ProtectControlGroups=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
LockPersonality=yes
SystemCallArchitectures=native

[Install]
WantedBy=default.target
"""


def write_templates(deploy_dir: Path) -> None:
    """Regenerate deploy/ from this module."""
    deploy_dir.mkdir(parents=True, exist_ok=True)
    (deploy_dir / f"{LABEL}.plist").write_bytes(render_plist(TEMPLATE_SPEC))
    (deploy_dir / UNIT_NAME).write_text(render_unit(TEMPLATE_SPEC))
