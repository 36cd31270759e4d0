"""The daemon's home folder: private by default, and tightened if an older version left it open.

Prompts leave traces under the home (SSD cache sidecars hold token ids, the responses database
holds conversations, logs name requests), so only the owner may read them: the process umask
becomes 077 before anything is created (workers inherit it), folders are made 0700, and what
already exists under the private folders loses its group and other bits.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("mlxd.home")

PRIVATE_UMASK = 0o077
# Folders whose contents can reveal prompts. models/ and the Hugging Face cache are left alone:
# they hold public weights, and may be large trees shared with other tools.
PRIVATE_DIRS = ("cache", "logs", "responses", "run")
# A cache of many thousands of entries is normal; a walk past this many is cut short so start-up
# stays quick on a huge or hostile tree (files created afterwards are 0600 through the umask).
MAX_TIGHTEN_ENTRIES = 200_000


def set_private_umask() -> int:
    """Make every file this process and its children create owner-only. Returns the old umask."""
    return os.umask(PRIVATE_UMASK)


def make_private_dir(path: Path) -> None:
    """Create `path` (and parents) if needed, and make it 0700."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    _tighten_one(path, os.lstat(path))


def prepare_home_dirs(home: Path) -> None:
    """Create the home's folders private and tighten what older runs left readable to others."""
    # An existing home keeps its own mode (it may be a folder the user chose for other things
    # too); what matters is that the private folders below it are 0700.
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    (home / "models").mkdir(exist_ok=True, mode=0o700)
    config = home / "config.toml"  # may hold the API key and admin token
    if (st := _lstat(config)) is not None and stat.S_ISREG(st.st_mode):
        _tighten_one(config, st)
    for name in PRIVATE_DIRS:
        make_private_dir(home / name)
        tighten_tree(home / name)


def tighten_tree(root: Path, max_entries: int = MAX_TIGHTEN_ENTRIES) -> int:
    """Remove group/other permission bits below `root`, never following symlinks.

    Returns how many entries were changed. Entries that cannot be changed (another owner, a
    vanished file) are logged and skipped: a permission fault must not stop the daemon.
    """
    changed = seen = 0
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            log.warning("cannot list %s to tighten its modes: %s", folder, exc.strerror)
            continue
        for entry in entries:
            seen += 1
            if seen > max_entries:
                log.warning("stopped tightening modes under %s after %d entries", root, max_entries)
                return changed
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                continue  # a link's target may be anywhere; its own mode means nothing
            changed += _tighten_one(Path(entry.path), st)
            if stat.S_ISDIR(st.st_mode):
                stack.append(Path(entry.path))
    return changed


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _tighten_one(path: Path, st: os.stat_result) -> int:
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o077:
        return 0
    try:
        os.chmod(path, mode & ~0o077)
    except OSError as exc:
        log.warning("cannot make %s private: %s", path, exc.strerror)
        return 0
    return 1
