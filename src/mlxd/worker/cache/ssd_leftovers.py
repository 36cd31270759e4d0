"""Leftovers in an SSD cache folder: temporary files, and data files without their sidecar.

A crash mid-write leaves them behind; so does, for a moment, a write in progress by another
worker of the same model id (a hot reload runs two for a while), which must keep its file. So
a leftover goes only once its last change is STALE_S old; one too recent at the start-up scan
is looked at again by `sweep` (from the cache's upkeep) instead of staying for good.
File I/O only: safe off the engine thread.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mlxd.worker.cache.format import DATA_SUFFIX, META_SUFFIX, TMP_SUFFIX

# Older than this, a temporary or lone data file belongs to no live writer (a write refreshes
# its file's time with every block, and writes the sidecar right after the data).
STALE_S = 60.0


def is_temporary(name: str) -> bool:
    return name.endswith(TMP_SUFFIX)


class Leftovers:
    """What the scan found left over in one folder; `removed` counts what went this run."""

    def __init__(self, folder: Path, failed: Callable[[OSError], None]):
        self.folder = folder
        self.failed = failed  # a removal refused (counted and logged by the store)
        self.removed = 0
        self.waiting: set[str] = set()  # too recent when seen: `sweep` looks again

    def consider(self, name: str, now: float) -> None:
        """Remove the leftover `name` if it is old enough (`now`: wall-clock seconds, as file
        times are); otherwise keep it for a later sweep."""
        path = self.folder / name
        self.waiting.discard(name)
        try:
            if now - path.lstat().st_mtime < STALE_S:
                self.waiting.add(name)
                return
            path.unlink()
        except FileNotFoundError:  # its writer finished or cleaned up meanwhile
            return
        except OSError as exc:  # a folder under that name, a read-only folder: not again
            self.failed(exc)
            return
        self.removed += 1

    def sweep(self, now: float) -> int:
        """Look again at the leftovers that were too recent; how many went now. A data file
        whose sidecar appeared since is a finished write, not a leftover."""
        before = self.removed
        for name in sorted(self.waiting):
            if name.endswith(DATA_SUFFIX) and self._has_sidecar(name):
                self.waiting.discard(name)
                continue
            self.consider(name, now)
        return self.removed - before

    def _has_sidecar(self, data_name: str) -> bool:
        try:
            return (self.folder / (data_name[: -len(DATA_SUFFIX)] + META_SUFFIX)).exists()
        except OSError:  # cannot tell: leave the file alone
            return True
