"""`mlxd` — the daemon's command line."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from mlxd.shared.config import load_settings
from mlxd.shared.logs import setup_logging


def _start(args: argparse.Namespace) -> int:
    flags = {"host": args.host, "port": args.port, "home": args.home,
             "log_level": args.log_level}
    try:
        settings = load_settings(flags, args.config)
    except Exception as exc:  # a bad config file or environment value: say which, then stop
        print(f"mlxd: invalid settings: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level, settings.logs_dir / "mlxd.log")
    from .daemon import serve

    try:
        import uvloop
        return uvloop.run(serve(settings))
    except ImportError:  # pragma: no cover
        return asyncio.run(serve(settings))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mlxd", description="Local LLM serving daemon on MLX.")
    sub = p.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="run the daemon in the foreground")
    start.add_argument("--host", help="address to bind (default 127.0.0.1)")
    start.add_argument("--port", type=int, help="port to bind (default 8080)")
    start.add_argument("--home", help="state folder (default ~/.mlxd, or $MLXD_HOME)")
    start.add_argument("--config", type=Path, help="TOML file (default $MLXD_HOME/config.toml)")
    start.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR")
    start.set_defaults(func=_start)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
