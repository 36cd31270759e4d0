"""The command-line parser of `mlxd` and `mlxctl`: usage mistakes in one line."""

from __future__ import annotations

import argparse
from typing import NoReturn

from mlxd.shared.exit_codes import EXIT_USAGE


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes in one line too (argparse prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")
