"""The home folder's modes and the one-daemon-per-home lock (no daemon: the functions directly)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mlxd.shared.config import Settings
from mlxd.supervisor.daemon import prepare_home
from mlxd.supervisor.homedir import PRIVATE_DIRS, tighten_tree
from mlxd.supervisor.pidlock import HomeLocked, PidLock


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def restore_umask():
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


def test_fresh_home_is_private_and_new_files_are_0600(tmp_path, restore_umask):
    os.umask(0o022)  # a typical login umask: what the daemon must not rely on
    home = tmp_path / "home"
    lock = prepare_home(Settings(home=home))
    try:
        for name in (*PRIVATE_DIRS, "models"):
            assert mode(home / name) == 0o700, name
        assert mode(home) == 0o700
        assert mode(home / "run" / "mlxd.pid") == 0o600
        # The umask is the process's from now on: logs, the responses DB and worker files too.
        (home / "logs" / "later.log").write_text("x")
        assert mode(home / "logs" / "later.log") == 0o600
        (home / "cache" / "sub").mkdir()
        assert mode(home / "cache" / "sub") == 0o700
    finally:
        lock.release()


def test_existing_open_files_are_tightened_but_models_and_link_targets_are_not(
    tmp_path, restore_umask
):
    home = tmp_path / "home"
    entry = home / "cache" / "fp" / "entry.safetensors"
    entry.parent.mkdir(parents=True)
    entry.write_text("kv")
    os.chmod(entry, 0o644)
    os.chmod(entry.parent, 0o755)
    db = home / "responses" / "responses.sqlite3"
    db.parent.mkdir()
    db.write_text("conversations")
    os.chmod(db, 0o666)
    config = home / "config.toml"
    config.write_text('api_key = "secret"\n')
    os.chmod(config, 0o644)
    weights = home / "models" / "m" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_text("w")
    os.chmod(weights, 0o644)
    outside = tmp_path / "outside.txt"  # a link in cache/ must not make us chmod its target
    outside.write_text("not ours to change")
    os.chmod(outside, 0o644)
    (home / "cache" / "link").symlink_to(outside)

    lock = prepare_home(Settings(home=home))
    lock.release()

    assert mode(entry) == 0o600
    assert mode(entry.parent) == 0o700
    assert mode(db) == 0o600
    assert mode(config) == 0o600
    assert mode(weights) == 0o644
    assert mode(outside) == 0o644


def test_tightening_is_bounded(tmp_path):
    for i in range(10):
        f = tmp_path / f"f{i}"
        f.write_text("x")
        os.chmod(f, 0o644)
    assert tighten_tree(tmp_path, max_entries=4) == 4
    assert sum(mode(tmp_path / f"f{i}") == 0o600 for i in range(10)) == 4


def test_second_lock_on_a_home_is_refused_with_the_holders_pid(tmp_path):
    # flock belongs to an open file description: a second open in the same process conflicts
    # exactly as a second daemon's would.
    first = PidLock.acquire(tmp_path, tmp_path)
    try:
        with pytest.raises(HomeLocked) as refused:
            PidLock.acquire(tmp_path, tmp_path)
        assert refused.value.pid == os.getpid()
        assert f"pid {os.getpid()}" in str(refused.value)
        assert "\n" not in str(refused.value)
        assert (tmp_path / "mlxd.pid").read_text().strip() == str(os.getpid())
    finally:
        first.release()
    # Released: the next daemon takes the home.
    PidLock.acquire(tmp_path, tmp_path).release()


def test_stale_pid_file_from_a_crashed_daemon_is_taken_over(tmp_path):
    (tmp_path / "mlxd.pid").write_text("999999\n")  # nobody holds its lock
    lock = PidLock.acquire(tmp_path, tmp_path)
    try:
        assert (tmp_path / "mlxd.pid").read_text().strip() == str(os.getpid())
    finally:
        lock.release()
    assert (tmp_path / "mlxd.pid").read_text() == ""


def test_a_link_planted_as_the_pid_file_is_not_followed(tmp_path):
    target = tmp_path / "victim"
    target.write_text("keep me")
    (tmp_path / "mlxd.pid").symlink_to(target)
    with pytest.raises(OSError):
        PidLock.acquire(tmp_path, tmp_path)
    assert target.read_text() == "keep me"
