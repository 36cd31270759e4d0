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

from mlxd import __version__
from mlxd.supervisor.ctl import local as ctl_local
from mlxd.supervisor.ctl import pull as ctl_pull
from mlxd.supervisor.ctl import tables as ctl_tables
from mlxd.supervisor.ctl import target
from mlxd.supervisor.ctl.adapters import add_adapter_commands
from mlxd.supervisor.ctl.client import AdminClient, CtlError, model_path
from mlxd.supervisor.ctl.fit_table import fit_text
from mlxd.supervisor.ctl.parser import OneLineParser, seconds
from mlxd.supervisor.ctl.progress import run_with_progress
from mlxd.supervisor.ctl.tables import out

DEFAULT_URL = target.DEFAULT_URL
FOLLOW_INTERVAL_S = 0.5


def cmd_ps(args, client: AdminClient) -> int:
    rows = [
        m for m in client.get("/admin/models")["data"] if m["state"] != "stopped" or m["drained"]
    ]
    if not args.json:  # which daemon answered, on stderr: stdout stays the table
        version = client.get("/health").get("version", "?")
        print(f"mlxd {version} at {client.url} (from {client.source})", file=sys.stderr)
    out(args, rows, ctl_tables.ps_table(rows))
    return 0


def cmd_models(args, client: AdminClient) -> int:
    rows = client.get("/admin/models")["data"]
    out(args, rows, ctl_tables.models_table(rows))
    return 0


def cmd_action(args, client: AdminClient) -> int:
    if args.action == "unload" and (args.all or args.model is None):
        return cmd_unload_all(args, client)
    path = model_path(args.model, args.action)
    if args.action not in ("load", "reload"):
        body = client.post(path)
    else:  # a load takes seconds to minutes: show where it is meanwhile, on stderr
        with AdminClient(client.url, args.token, args.timeout, source=client.source) as poller:
            body = run_with_progress(
                lambda: client.post(path), lambda: poller.get(model_path(args.model))
            )
    out(args, body, ctl_tables.action_text(body))
    return 0


def cmd_unload_all(args, client: AdminClient) -> int:
    if not args.all:
        raise CtlError("name the model to unload, or pass --all")
    running = [m["id"] for m in client.get("/admin/models")["data"] if m["state"] != "stopped"]
    bodies = [client.post(model_path(model_id, "unload")) for model_id in running]
    text = "\n".join(ctl_tables.action_text(b) for b in bodies) or "no model is loaded"
    out(args, bodies, text)
    return 0


def cmd_show(args, client: AdminClient) -> int:
    body = client.get(model_path(args.model))
    out(args, body, ctl_tables.show_text(body))
    return 0


def cmd_fit(args, client: AdminClient) -> int:
    body = client.get("/admin/fit", model=args.model)
    out(args, body, fit_text(body))
    return 0


def cmd_run(args, client: AdminClient) -> int:
    import httpx

    from mlxd.supervisor.ctl import run

    options = {"max_tokens": args.max_tokens, "temperature": args.temperature}
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    timeout = httpx.Timeout(args.timeout, connect=10.0)
    with httpx.Client(base_url=client.url, headers=headers, timeout=timeout) as http:
        return run.run(
            http,
            args.model,
            args.prompt,
            {k: v for k, v in options.items() if v is not None},
            args.system,
            client.source,
            args.verbose,
        )


def cmd_flush(args, client: AdminClient) -> int:
    body = client.post("/admin/cache/flush")
    out(args, body, ctl_tables.flush_text(body))
    return 1 if body["failed"] else 0


def cmd_stats(args, client: AdminClient) -> int:
    body = client.get("/admin/stats")
    out(args, body, ctl_tables.stats_text(body))
    return 0


def cmd_logs(args, client: AdminClient) -> int:
    path = model_path(args.model, "logs")
    body = client.get(path, tail=args.tail)
    if not args.follow:
        out(args, body, "\n".join(body["lines"]))
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


def cmd_pull(args, client: AdminClient) -> int:
    try:
        body = ctl_pull.pull(client, args.repo, args.revision, args.home, args.hf_endpoint)
    except KeyboardInterrupt:
        print("mlxctl: interrupted (pull again to go on from there)", file=sys.stderr)
        return 130
    where = f"into {body['path']}" if "path" in body else f"through mlxd at {body['via']}"
    out(args, body, f"pulled {body['model']} ({body['repo']}) {where}")
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
    out(args, {"id": args.model, "removed": str(path)}, f"removed {path}")
    return 0


def cmd_import_gguf(args, client: AdminClient | None) -> int:
    # The importer prints its own progress and its one error line; its exit status is ours.
    return ctl_local.import_gguf(args.file, args.home / "models", args.id, args.overwrite)


def build_parser() -> argparse.ArgumentParser:
    common = OneLineParser(add_help=False)
    # SUPPRESS: an option given after the command must not be reset by the subparser.
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )
    p = OneLineParser(prog="mlxctl", parents=[common], description="Control a running mlxd daemon.")
    p.add_argument("--version", action="version", version=f"mlxctl {__version__}")
    p.add_argument(
        "--url",
        help="the daemon (default: $MLXD_URL, $MLXD_HOST/$MLXD_PORT, the home's run/mlxd.url, "
        f"its config.toml, {DEFAULT_URL})",
    )
    p.add_argument("--token", help="admin token (default $MLXD_ADMIN_TOKEN)")
    p.add_argument("--api-key", help="API key for `run` (default $MLXD_API_KEY)")
    p.add_argument(
        "--home",
        type=Path,
        help="the daemon's state folder (default $MLXD_HOME or ~/.mlxd)",
    )
    p.add_argument("--timeout", type=seconds, default=600.0, help="seconds to wait for the daemon")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func, help: str, aliases=()) -> argparse.ArgumentParser:
        # No abbreviated options: a prompt word such as --verb is not taken for --verbose.
        sp = sub.add_parser(
            name, parents=[common], help=help, aliases=list(aliases), allow_abbrev=False
        )
        sp.set_defaults(func=func, action=name)
        return sp

    add("ps", cmd_ps, "models with a worker (state, pid, memory, leases, keep-alive)")
    add("models", cmd_models, "every model mlxd can serve", aliases=["ls"])
    add("show", cmd_show, "a model's state, folder, settings and defaults").add_argument("model")
    fit = add("fit", cmd_fit, "the largest context and batch that fit, per KV scheme")
    fit.add_argument("model")
    for name, what in (
        ("load", "start a model's worker now"),
        ("drain", "stop a model and refuse requests until it is loaded again"),
        ("reload", "hot-swap a model's worker (resets a FATAL model)"),
    ):
        add(name, cmd_action, what).add_argument("model")
    unload = add(
        "unload",
        cmd_action,
        "drain and stop a model (the next request loads it again)",
        aliases=["stop"],
    )
    unload.add_argument("model", nargs="?")
    unload.add_argument("--all", action="store_true", help="every loaded model")
    run = add("run", cmd_run, "chat with a model: one answer for PROMPT, else interactively")
    run.add_argument("model")
    run.add_argument("prompt", nargs="?", help="answer this and exit (default: read stdin)")
    run.add_argument("--system", help="system prompt")
    run.add_argument("--max-tokens", type=int, help="most tokens per answer")
    run.add_argument("--temperature", type=float, help="sampling temperature")
    run.add_argument("--verbose", action="store_true", help="token counts and speed per answer")
    add_adapter_commands(add)
    add("flush", cmd_flush, "flush every loaded model's prompt cache to disk")
    add("stats", cmd_stats, "supervisor counters and every worker's statistics")
    logs = add("logs", cmd_logs, "a model's worker log")
    logs.add_argument("model")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.add_argument("--tail", type=int, default=100, help="lines to show first (default 100)")
    pull = add("pull", cmd_pull, "download a model from Hugging Face (resumes where it stopped)")
    pull.add_argument("repo", help="org/name, or a name of mlxd's table (qwen3:8b, …)")
    pull.add_argument("--revision", help="branch, tag or commit")
    add("rm", cmd_rm, "delete a model folder from $MLXD_HOME/models").add_argument("model")
    gguf = add("import-gguf", cmd_import_gguf, "convert a GGUF file into $MLXD_HOME/models")
    gguf.add_argument("file")
    gguf.add_argument("--id", help="model id (default: from the file name)")
    gguf.add_argument("--overwrite", action="store_true", help="replace a model of that id")
    return p


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line. `run MODEL --max-tokens 5 PROMPT` works: argparse fills the
    optional PROMPT before it reaches the options, so words left over after them are the
    prompt (several are joined by spaces, as `ollama run` does)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        if getattr(args, "func", None) is cmd_run and not any(w.startswith("-") for w in extra):
            args.prompt = " ".join([args.prompt, *extra] if args.prompt else extra)
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "action", None) == "unload" and args.all and args.model is not None:
        parser.error("name a model to unload, or pass --all, not both")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.json = getattr(args, "json", False)
    env = os.environ  # the only place mlxctl reads the environment
    args.token = args.token or env.get("MLXD_ADMIN_TOKEN") or None
    args.api_key = args.api_key or env.get("MLXD_API_KEY") or None
    args.home = (args.home or Path(env.get("MLXD_HOME") or "~/.mlxd")).expanduser()
    args.hf_endpoint = env.get("HF_ENDPOINT") or None  # a pull without a daemon
    try:
        daemon = target.resolve(args.url, env, args.home)
    except CtlError as exc:
        print(f"mlxctl: {exc}", file=sys.stderr)
        return 1
    args.url = daemon.url
    client = AdminClient(args.url, args.token, args.timeout, source=daemon.source)
    try:
        return args.func(args, client)
    except CtlError as exc:
        print(f"mlxctl: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
