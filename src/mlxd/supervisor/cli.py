"""`mlxd` — the daemon's command line."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
from pathlib import Path

from mlxd import __version__
from mlxd.shared.config import ConfigError
from mlxd.shared.config_load import load_settings
from mlxd.shared.exit_codes import EXIT_USAGE
from mlxd.shared.logs import setup_logging
from mlxd.supervisor.ctl.parser import OneLineParser

EXIT_STARTUP = EXIT_USAGE  # every reason `mlxd start` refuses to start, one line on stderr


def _refuse(reason: str) -> int:
    print(f"mlxd: {reason}", file=sys.stderr)
    return EXIT_STARTUP


def _start(args: argparse.Namespace) -> int:
    flags = {
        "host": args.host,
        "port": args.port,
        "home": args.home,
        "log_level": args.log_level,
        "insecure": args.insecure or None,
    }
    try:
        settings = load_settings(flags, args.config)
    except ConfigError as exc:  # a bad config file or environment value: say which, then stop
        return _refuse(str(exc))
    from mlxd.shared.builtin_model import BUILTIN_MODEL_ID, find_builtin_gguf
    from mlxd.supervisor.catalog.discovery import (
        alias_problem,
        config_path_problem,
        default_model_problem,
    )
    from mlxd.supervisor.http.auth import bind_refusal

    builtin = (BUILTIN_MODEL_ID,) if find_builtin_gguf() is not None else ()
    refusal = (
        bind_refusal(settings)
        or config_path_problem(settings)
        or alias_problem(settings)
        or default_model_problem(settings, importable=builtin)
    )
    if refusal is not None:
        return _refuse(refusal)
    from mlxd.supervisor.daemon import StartupError, prepare_home, serve
    from mlxd.supervisor.pidlock import HomeLocked

    try:  # before logging opens its file, so the log is created private and by one daemon
        lock = prepare_home(settings)
    except HomeLocked as exc:
        return _refuse(str(exc))
    except OSError as exc:
        return _refuse(f"cannot prepare home {settings.home_dir}: {exc.strerror}")
    setup_logging(settings.log_level, settings.logs_dir / "mlxd.log")

    try:
        try:
            import uvloop

            return uvloop.run(serve(settings, lock))
        except ImportError:  # pragma: no cover
            return asyncio.run(serve(settings, lock))
    except StartupError as exc:
        return _refuse(str(exc))


def _service(args: argparse.Namespace) -> int:
    from mlxd.supervisor.ctl import service
    from mlxd.supervisor.ctl.service_files import ServiceSpec

    try:
        kind = service.platform_kind(args.platform or sys.platform)
    except ValueError as exc:
        print(f"mlxd service: {exc}", file=sys.stderr)
        return 2
    home = Path(args.home or os.environ.get("MLXD_HOME") or "~/.mlxd").expanduser().resolve()
    path_env = os.pathsep.join(
        dict.fromkeys(
            [str(Path(sys.executable).parent), *os.environ.get("PATH", "/usr/bin:/bin").split(":")]
        )
    )
    spec = ServiceSpec(
        program=service.program(sys.executable, shutil.which("mlxd")),
        home=str(home),
        path_env=path_env,
    )
    p = service.plan(args.action, kind, spec, Path.home(), os.getuid())
    if args.action == "install" and not args.dry_run:
        (home / "logs").mkdir(parents=True, exist_ok=True)  # the service's log and write paths
    return service.execute(p, dry_run=args.dry_run)


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="mlxd", description="Local LLM serving daemon on MLX.")
    p.add_argument("--version", action="version", version=f"mlxd {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="run the daemon in the foreground")
    start.add_argument("--host", help="address to bind (default 127.0.0.1)")
    start.add_argument("--port", type=int, help="port to bind (default 8080)")
    start.add_argument("--home", help="state folder (default ~/.mlxd, or $MLXD_HOME)")
    start.add_argument("--config", type=Path, help="TOML file (default $MLXD_HOME/config.toml)")
    start.add_argument("--log-level", help="DEBUG, INFO, WARNING or ERROR")
    start.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback --host without an API key"
    )
    start.set_defaults(func=_start)
    svc = sub.add_parser("service", help="run mlxd at login (launchd on macOS, systemd on Linux)")
    svc.add_argument("action", choices=["install", "uninstall", "status"])
    svc.add_argument("--dry-run", action="store_true", help="print the file and the commands")
    svc.add_argument("--home", help="state folder the service uses (default ~/.mlxd)")
    svc.add_argument("--platform", choices=["darwin", "linux"], help=argparse.SUPPRESS)
    svc.set_defaults(func=_service)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
