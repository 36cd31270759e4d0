"""Which daemon mlxctl talks to, and what chose it (docs/configuration.md, "Finding the daemon").

First found wins: `--url`; `$MLXD_URL`; `$MLXD_HOST` / `$MLXD_PORT` (the other half from the
home's config.toml, as the daemon itself would fill it in); the URL the home's running daemon
wrote (`run/mlxd.url`); host and port in the home's config.toml; http://127.0.0.1:8080.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from mlxd.supervisor.ctl import urlfile
from mlxd.supervisor.ctl.client import CtlError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_URL = urlfile.client_url(DEFAULT_HOST, DEFAULT_PORT)


@dataclass(frozen=True)
class Target:
    """A daemon's URL and where it came from (shown in `mlxctl ps` and in errors)."""

    url: str
    source: str


def _config(home: Path) -> dict[str, Any]:
    """host and port of the home's config.toml ({} when there is none or it does not parse:
    such a daemon refuses to start, and mlxctl then falls back like for no file)."""
    try:
        with (home / "config.toml").open("rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    return {k: data[k] for k in ("host", "port") if k in data}


def _port(value: object, where: str) -> int:
    try:
        port = int(str(value))
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise CtlError(f"{where} is {value!r}, not a port number")
    return port


def resolve(url: str | None, env: Mapping[str, str], home: Path) -> Target:
    """The daemon mlxctl should call (see the module docstring for the order)."""
    if url:
        return Target(url.rstrip("/"), "--url")
    if env.get("MLXD_URL"):
        return Target(env["MLXD_URL"].rstrip("/"), "$MLXD_URL")
    config = _config(home)
    if env.get("MLXD_HOST") or env.get("MLXD_PORT"):
        names = [f"${n}" for n in ("MLXD_HOST", "MLXD_PORT") if env.get(n)]
        host = env.get("MLXD_HOST") or str(config.get("host") or DEFAULT_HOST)
        where = "$MLXD_PORT" if env.get("MLXD_PORT") else f"port in {home / 'config.toml'}"
        port = _port(env.get("MLXD_PORT") or config.get("port") or DEFAULT_PORT, where)
        return Target(urlfile.client_url(host, port), " and ".join(names))
    written = urlfile.read(home / "run")
    if written:
        return Target(written, str(home / "run" / urlfile.URL_FILE))
    if config:
        where = f"port in {home / 'config.toml'}"
        port = _port(config.get("port", DEFAULT_PORT), where)
        host = str(config.get("host") or DEFAULT_HOST)
        return Target(urlfile.client_url(host, port), str(home / "config.toml"))
    return Target(DEFAULT_URL, "the default")
