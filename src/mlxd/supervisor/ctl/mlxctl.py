"""`mlxctl` — control a running mlxd through its /admin API, and manage model folders.

    mlxctl [--url URL] [--token TOKEN] [--json] COMMAND ...

Readable tables by default, `--json` for scripts; any failure exits non-zero with one line.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import orjson

from mlxd.supervisor.ctl import local as ctl_local
from mlxd.supervisor.ctl import tables as ctl_tables
from mlxd.supervisor.ctl.client import AdminClient, CtlError, model_path

DEFAULT_URL = "http://127.0.0.1:8080"
FOLLOW_INTERVAL_S = 0.5


def _out(args: argparse.Namespace, body, text: str) -> None:
    if args.json:
        sys.stdout.write(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode() + "\n")
    elif text:
        print(text)


def cmd_ps(args, client: AdminClient) -> int:
    rows = [
        m for m in client.get("/admin/models")["data"] if m["state"] != "stopped" or m["drained"]
    ]
    _out(args, rows, ctl_tables.ps_table(rows))
    return 0


def cmd_models(args, client: AdminClient) -> int:
    rows = client.get("/admin/models")["data"]
    _out(args, rows, ctl_tables.models_table(rows))
    return 0


def cmd_action(args, client: AdminClient) -> int:
    body = client.post(model_path(args.model, args.command))
    _out(args, body, ctl_tables.action_text(body))
    return 0


def cmd_flush(args, client: AdminClient) -> int:
    body = client.post("/admin/cache/flush")
    _out(args, body, ctl_tables.flush_text(body))
    return 1 if body["failed"] else 0


def cmd_stats(args, client: AdminClient) -> int:
    body = client.get("/admin/stats")
    _out(args, body, ctl_tables.stats_text(body))
    return 0


def cmd_logs(args, client: AdminClient) -> int:
    path = model_path(args.model, "logs")
    body = client.get(path, tail=args.tail)
    if not args.follow:
        _out(args, body, "\n".join(body["lines"]))
        return 0
    file, offset = body["file"], body["offset"]
    _print_lines(args, file, body["lines"])
    try:
        while True:
            time.sleep(FOLLOW_INTERVAL_S)
            body = client.get(path, after=offset)
            if body["file"] != file:  # a reload started a new worker with its own log
                file = body["file"]
                body = client.get(path, after=0)
                if not args.json:
                    print(f"==> {file} <==", flush=True)
            offset = body["offset"]
            _print_lines(args, file, body["lines"])
    except KeyboardInterrupt:
        return 0


def _print_lines(args, file: str, lines: list[str]) -> None:
    for line in lines:
        if args.json:
            print(orjson.dumps({"file": file, "line": line}).decode())
        else:
            print(line)
    sys.stdout.flush()


def cmd_pull(args, client: AdminClient | None) -> int:
    dest = ctl_local.pull(args.repo, args.home / "models", args.revision)
    _out(args, {"repo": args.repo, "path": str(dest)}, f"pulled {args.repo} into {dest}")
    return 0


def cmd_rm(args, client: AdminClient) -> int:
    try:
        state = client.get(model_path(args.model))["state"]
    except CtlError as exc:
        if not str(exc).startswith(("cannot reach", "404")):
            raise
        state = "stopped"  # the daemon is not running, or does not know this model
    if state != "stopped":
        raise CtlError(f"'{args.model}' is {state}; unload it first (mlxctl unload {args.model})")
    path = ctl_local.remove(args.home / "models", args.model)
    _out(args, {"id": args.model, "removed": str(path)}, f"removed {path}")
    return 0


def cmd_import_gguf(args, client: AdminClient | None) -> int:
    # The importer prints its own progress and its one error line; its exit status is ours.
    return ctl_local.import_gguf(args.file, args.home / "models", args.id, args.overwrite)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: an option given after the command must not be reset by the subparser.
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )
    p = argparse.ArgumentParser(
        prog="mlxctl", parents=[common], description="Control a running mlxd daemon."
    )
    p.add_argument("--url", help=f"the daemon (default $MLXD_URL or {DEFAULT_URL})")
    p.add_argument("--token", help="admin token (default $MLXD_ADMIN_TOKEN)")
    p.add_argument(
        "--home",
        type=Path,
        help="state folder for pull/rm/import-gguf (default $MLXD_HOME or ~/.mlxd)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the daemon")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func, help: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, parents=[common], help=help)
        sp.set_defaults(func=func)
        return sp

    add("ps", cmd_ps, "models with a worker (state, pid, memory, leases, keep-alive)")
    add("models", cmd_models, "every model mlxd can serve")
    for name, what in (
        ("load", "start a model's worker now"),
        ("unload", "drain and stop a model (the next request loads it again)"),
        ("drain", "stop a model and refuse requests until it is loaded again"),
        ("reload", "hot-swap a model's worker (resets a FATAL model)"),
    ):
        add(name, cmd_action, what).add_argument("model")
    add("flush", cmd_flush, "flush every loaded model's prompt cache to disk")
    add("stats", cmd_stats, "supervisor counters and every worker's statistics")
    logs = add("logs", cmd_logs, "a model's worker log")
    logs.add_argument("model")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.add_argument("--tail", type=int, default=100, help="lines to show first (default 100)")
    pull = add("pull", cmd_pull, "download a model from Hugging Face into $MLXD_HOME/models")
    pull.add_argument("repo", help="org/name")
    pull.add_argument("--revision", help="branch, tag or commit")
    add("rm", cmd_rm, "delete a model folder from $MLXD_HOME/models").add_argument("model")
    gguf = add("import-gguf", cmd_import_gguf, "convert a GGUF file into $MLXD_HOME/models")
    gguf.add_argument("file")
    gguf.add_argument("--id", help="model id (default: from the file name)")
    gguf.add_argument("--overwrite", action="store_true", help="replace a model of that id")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.json = getattr(args, "json", False)
    env = os.environ  # the only place mlxctl reads the environment
    args.url = args.url or env.get("MLXD_URL") or DEFAULT_URL
    args.token = args.token or env.get("MLXD_ADMIN_TOKEN") or None
    args.home = (args.home or Path(env.get("MLXD_HOME") or "~/.mlxd")).expanduser()
    client = AdminClient(args.url, args.token, args.timeout)
    try:
        return args.func(args, client)
    except CtlError as exc:
        print(f"mlxctl: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
