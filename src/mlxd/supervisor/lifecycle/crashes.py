"""What an unexpected worker exit leads to: a restart after a doubling delay, or FATAL.

A pure function over the slot's crash times, so the policy is tested without processes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mlxd.shared.config import Settings
from mlxd.shared.exit_codes import NO_RESTART


@dataclass(frozen=True)
class CrashVerdict:
    """`fatal`: stop restarting; otherwise restart after `delay_s`. `recent`: crashes counted."""

    fatal: bool
    recent: int
    delay_s: float = 0.0


def judge_crash(
    crashes: Iterable[float], now: float, code: int, settings: Settings
) -> CrashVerdict:
    """The verdict on an exit with `code` at `now`, `crashes` holding every crash time so far
    (this one included). Exit codes in NO_RESTART (a model that cannot load) are FATAL at
    once; otherwise crash_limit crashes within crash_window_s are."""
    recent = sum(1 for t in crashes if now - t <= settings.crash_window_s)
    if code in NO_RESTART or recent >= settings.crash_limit:
        return CrashVerdict(fatal=True, recent=recent)
    delay_s = min(settings.backoff_initial_s * 2 ** (recent - 1), settings.backoff_max_s)
    return CrashVerdict(fatal=False, recent=recent, delay_s=delay_s)
