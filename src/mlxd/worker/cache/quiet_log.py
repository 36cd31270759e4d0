"""Log lines for failures that repeat (a full disk, an unreadable folder): one per kind and
period, so a fault shows in the log without burying it."""

from __future__ import annotations

import logging
import time

LOG_EVERY_S = 60.0


class QuietLog:
    """A repeating failure logs one line per kind and period, with how many it folded in."""

    def __init__(self, logger: logging.Logger, every_s: float = LOG_EVERY_S):
        self.log = logger
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._folded: dict[str, int] = {}

    def warn(self, kind: str, exc: BaseException) -> None:
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self.every_s:
            self._folded[kind] = self._folded.get(kind, 0) + 1
            return
        folded = self._folded.pop(kind, 0)
        more = f" (and {folded} more since the last report)" if folded else ""
        self.log.warning("%s failed: %s%s", kind, exc, more)
        self._last[kind] = now
