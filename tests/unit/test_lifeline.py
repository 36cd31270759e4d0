"""A follower rank ends when its parent does, even with its main thread stuck."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

# The middle process starts a grandchild that arms the lifeline, then blocks forever in a
# sleep (a follower stuck in a collective), and prints the grandchild's pid.
MIDDLE = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
print(child.pid, flush=True)
child.wait()
"""
STUCK = """
import time
from mlxd.worker.lifeline import exit_when_orphaned
exit_when_orphaned(7, interval_s=0.05)
print("armed", flush=True)
time.sleep(600)
"""


def test_an_orphaned_process_exits_even_while_its_main_thread_is_stuck():
    middle = subprocess.Popen(
        [sys.executable, "-c", MIDDLE, STUCK], stdout=subprocess.PIPE, text=True
    )
    try:
        assert middle.stdout is not None
        grandchild = psutil.Process(int(middle.stdout.readline()))
        # Killed before it armed (a slow start on a busy machine), it would already be an
        # orphan with nothing to notice: wait for its word (it shares the middle's stdout).
        assert middle.stdout.readline().strip() == "armed"
        time.sleep(0.5)
        assert grandchild.is_running()  # the parent lives: so does it
        os.kill(middle.pid, signal.SIGKILL)
        middle.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if not grandchild.is_running() or grandchild.status() == psutil.STATUS_ZOMBIE:
                break
            time.sleep(0.05)
        else:
            grandchild.kill()
            raise AssertionError("the orphan kept running")
    finally:
        middle.kill()
