"""The command-line parsers of `mlxd` and `mlxctl`: usage mistakes in one line, and the
argument types they share."""

from __future__ import annotations

import argparse
import math
from typing import NoReturn

from mlxd.shared.exit_codes import EXIT_USAGE


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes in one line too (argparse prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


MAX_TIMEOUT_S = 1e6  # about 11 days; far beyond, sockets refuse the value (OverflowError)


def seconds(text: str) -> float:
    """A positive, finite number of seconds (argparse's type for --timeout)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}"
        )
    return value
