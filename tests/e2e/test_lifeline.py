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
from mlxd.shared.lifeline import exit_when_orphaned
exit_when_orphaned(7, interval_s=0.05)
print("armed", flush=True)
time.sleep(600)
"""


def _orphan_ends(code: str, word: str, parent_lives=None) -> None:
    """Start `code` as a grandchild, wait for it to print `word` (it shares the middle's
    stdout), kill the middle (after `parent_lives(grandchild)`, if given), and assert the
    orphan ends within 20 s."""
    middle = subprocess.Popen(
        [sys.executable, "-c", MIDDLE, code], stdout=subprocess.PIPE, text=True
    )
    try:
        assert middle.stdout is not None
        grandchild = psutil.Process(int(middle.stdout.readline()))
        assert middle.stdout.readline().strip() == word
        if parent_lives is not None:
            parent_lives(grandchild)
        os.kill(middle.pid, signal.SIGKILL)
        middle.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if not grandchild.is_running() or grandchild.status() == psutil.STATUS_ZOMBIE:
                return
            time.sleep(0.05)
        grandchild.kill()
        raise AssertionError("the orphan kept running")
    finally:
        middle.kill()


def test_an_orphaned_process_exits_even_while_its_main_thread_is_stuck():
    def still_running(grandchild):
        time.sleep(0.5)
        assert grandchild.is_running()  # the parent lives: so does it

    # Killed before it armed (a slow start on a busy machine), it would not be testing the
    # armed lifeline: it says "armed" first.
    _orphan_ends(STUCK, "armed", still_running)


# Orphaned between importing the lifeline and arming it (a worker's slow start): the parent it
# started under is the one it watches, so it still exits.
LATE = """
import os, time
from mlxd.shared import lifeline
start = os.getppid()
print("imported", flush=True)
while os.getppid() == start:
    time.sleep(0.01)
lifeline.exit_when_orphaned(7, interval_s=0.05)
time.sleep(600)
"""


def test_a_parent_gone_before_the_lifeline_is_armed_still_ends_the_process():
    _orphan_ends(LATE, "imported")
