"""mlxctl and the service files as real commands: `pull` offline says why in one line, and
the systemd unit passes `systemd-analyze verify`. (Moved from tests/unit, which starts no
process.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from mlxd.supervisor.ctl.service_files import ServiceSpec, render_unit


def test_pull_offline_says_why_in_one_line(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxd.supervisor.ctl.mlxctl",
            "--home",
            str(tmp_path),
            "pull",
            "someone/not-cached-anywhere",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    )
    assert p.returncode == 1
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "mlxctl: cannot download someone/not-cached-anywhere: "
    )


@pytest.mark.parametrize("home", ["/srv/mlxd home", "/var/lib/mlxd"])
def test_unit_passes_systemd_analyze_verify(tmp_path, home):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    unit = tmp_path / "mlxd.service"
    spec = ServiceSpec(program=(sys.executable, "-m", "mlxd.supervisor", "start"), home=home)
    unit.write_text(render_unit(spec))
    p = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    complaints = [ln for ln in (p.stdout + p.stderr).splitlines() if "mlxd.service" in ln]
    assert p.returncode == 0 and not complaints, p.stdout + p.stderr
