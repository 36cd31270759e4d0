"""`$MLXD_HOME/run/mlxd.url`: where the running daemon of a home answers.

The daemon writes it once it listens and removes it on a clean exit; mlxctl (and any other
local client) reads it to find the daemon without being told its port (docs/operations.md).
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

URL_FILE = "mlxd.url"
# A wildcard bind is reached through loopback.
WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def client_url(host: str, port: int) -> str:
    """The URL a local client uses for a daemon bound to host:port."""
    host = WILDCARDS.get(host, host)
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass  # a host name
    return f"http://{host}:{port}"


def write(run_dir: Path, url: str) -> Path:
    """Write `url` atomically (a reader never sees half a URL)."""
    path = run_dir / URL_FILE
    tmp = run_dir / f".{URL_FILE}.{os.getpid()}"
    tmp.write_text(url + "\n")
    os.replace(tmp, path)
    return path


def read(run_dir: Path) -> str | None:
    """The URL in the home's file, or None when there is none (no daemon ran, or it stopped)."""
    try:
        url = (run_dir / URL_FILE).read_text().strip()
    except OSError:
        return None
    return url or None


def remove(run_dir: Path, url: str) -> None:
    """Remove the file if it still names `url` (never another daemon's)."""
    if read(run_dir) == url:
        (run_dir / URL_FILE).unlink(missing_ok=True)
