"""mlxctl and the service files as real commands: `pull` offline says why in one line (after
its progress), and the systemd unit passes `systemd-analyze verify`. (Moved from tests/unit,
which starts no process.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from mlxd.supervisor.ctl.service_files import ServiceSpec, render_unit

from procs import free_port


def test_pull_offline_says_why_in_one_line(tmp_path):
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlxd.supervisor.ctl.mlxctl",
            "--url",  # no daemon there: mlxctl pulls by itself
            f"http://127.0.0.1:{free_port()}",
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
    err = p.stderr.strip().splitlines()  # progress lines, then the one line that says why
    assert [line for line in err if line.startswith("mlxctl:")] == err[-1:]
    assert err[-1] == "mlxctl: cannot download someone/not-cached-anywhere: HF_HUB_OFFLINE is set"


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
