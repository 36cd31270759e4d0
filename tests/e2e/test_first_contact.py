"""First contact without silences: `MLXD_PORT=P make run` prints its real address, the
dashboard and a curl line that works; a load shows its phases on the daemon's terminal and in
`mlxctl load` while it waits."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from procs import ROOT, free_port

PHASES = re.compile(r"^a: starting, (?P<phase>[a-z ]+) \(\d+s\)$")
ORDER = [
    "waiting for the worker",
    "starting the worker process",
    "loading weights",
    "opening the prompt cache",
    "warming up",
]


class MakeRun:
    """`make -s run` in its own process group, its terminal output in a file."""

    def __init__(self, home: Path, port: int):
        self.home, self.port, self.url = home, port, f"http://127.0.0.1:{port}"
        self.out = home / "terminal.out"
        env = {
            **os.environ,
            "MLXD_HOME": str(home),
            "MLXD_PORT": str(port),
            "MLXD_DEFAULT_MODEL": "a",
            "MLXD_DISCOVER_HF_CACHE": "false",
            "MLXD_KV_ALLOWANCE_BYTES": str(2 << 20),
            "PYTHONUNBUFFERED": "1",
        }
        self.proc = subprocess.Popen(
            ["make", "-s", "run"],
            cwd=ROOT,
            env=env,
            stdout=open(self.out, "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # make and mlxd stop together
        )

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout_s: float = 120.0) -> re.Match:
        """The first match of `pattern` in the terminal output, waiting for it to appear."""
        deadline = time.monotonic() + timeout_s
        while (m := re.search(pattern, self.text(), re.M)) is None:
            assert self.proc.poll() is None, f"make run exited:\n{self.text()}"
            assert time.monotonic() < deadline, f"no {pattern!r} in:\n{self.text()}"
            time.sleep(0.1)
        return m

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="module")
def make_run(tiny_model_dir, tmp_path_factory):
    home = tmp_path_factory.mktemp("first-contact")
    shutil.copytree(tiny_model_dir, home / "models" / "a")
    run = MakeRun(home, free_port())
    yield run
    run.stop()


def test_make_run_prints_the_real_port_the_dashboard_and_a_curl_that_works(make_run):
    url = make_run.url
    make_run.wait_for(r"^  try: curl ")
    assert re.search(rf"^mlxd \S+: serving on {url} \(Ctrl-C stops\)$", make_run.text(), re.M)
    assert f"  dashboard: {url}/ui\n" in make_run.text()
    assert "8080" not in make_run.text()  # the Makefile's own banner named it whatever the port
    assert httpx.get(f"{url}/ui", headers={"Accept": "text/html"}).status_code == 200
    curl = make_run.wait_for(r"^  try: (curl .*)$").group(1)
    assert curl.startswith(f"curl {url}/v1/chat/completions ")
    p = subprocess.run([*shlex.split(curl), "-sS"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and '"chat.completion"' in p.stdout, p.stdout + p.stderr
    # The load the curl waited for was shown on the terminal as it went, phase by phase.
    shown = re.findall(r"model=a loading: ([a-z ]+) \(\d+\.\ds\)", make_run.text())
    assert shown[0] == "starting the worker process" and "warming up" in shown, shown
    assert shown == sorted(shown, key=ORDER.index)


def test_mlxctl_load_shows_state_phase_and_seconds_while_it_waits(make_run):
    make_run.wait_for(r"^  try: curl ")
    ctl = [sys.executable, "-m", "mlxd.supervisor.ctl.mlxctl", "--url", make_run.url]
    assert subprocess.run([*ctl, "unload", "a"], capture_output=True, timeout=120).returncode == 0
    p = subprocess.run([*ctl, "load", "a"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert re.fullmatch(r"a: loaded in \d+\.\ds \(state ready, pid \d+\)\n", p.stdout), p.stdout
    lines = p.stderr.splitlines()
    assert lines, "mlxctl load printed nothing while it waited"
    phases = [PHASES.fullmatch(line).group("phase") for line in lines]  # each line, this form
    assert len(set(phases)) == len(phases) and phases == sorted(phases, key=ORDER.index)
