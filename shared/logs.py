"""Logging setup for both processes: readable lines on the terminal, one file per process."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str = "INFO", file: Path | None = None) -> None:
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(level.upper())
    term = logging.StreamHandler(sys.stderr)
    term.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(term)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(file)
        fh.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(fh)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
