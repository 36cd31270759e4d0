"""`mlxctl pull NAME`: a model downloaded through the running daemon's /api/pull (its NDJSON
progress shown as it comes), or by mlxctl itself with the same code when no daemon answers.
Either way the progress is Ollama's lines (supervisor/store/progress.py), an interrupted pull
(Ctrl-C, a dropped connection) goes on from the bytes it got, and one pull per model runs.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import IO

import httpx
import orjson

from mlxd.shared.errors import MlxdError
from mlxd.shared.wire.ollama_manage import ProgressLine
from mlxd.supervisor.ctl.client import AdminClient, CtlError, unreachable
from mlxd.supervisor.store import puller
from mlxd.supervisor.store.hub import Hub
from mlxd.supervisor.store.names import PullTarget, pull_target
from mlxd.supervisor.store.progress import line_text


class Printer:
    """Progress on stderr: one line rewritten in place on a terminal; elsewhere a line per
    status and per tenth of each file."""

    def __init__(self, out: IO[str] | None = None):
        self.out = out or sys.stderr
        self.tty = self.out.isatty()
        self.lock = threading.Lock()  # a local pull reports from its thread
        self._shown: tuple[str, int] | None = None

    def show(self, line: ProgressLine) -> None:
        tenth = (line.completed or 0) * 10 // line.total if line.total else -1
        with self.lock:
            if self.tty:
                self.out.write("\r\x1b[K" + line_text(line))
            elif (line.status, tenth) != self._shown:
                self.out.write(line_text(line) + "\n")
            self._shown = (line.status, tenth)
            self.out.flush()

    def close(self) -> None:
        if self.tty and self._shown is not None:
            self.out.write("\n")
            self.out.flush()


def through_daemon(client: AdminClient, name: str, revision: str | None, show: Printer) -> None:
    """Pull with the daemon's /api/pull, showing its lines; a failure is a CtlError."""
    body = {"model": name, "stream": True, **({"revision": revision} if revision else {})}
    try:
        with client.http.stream("POST", "/api/pull", json=body) as r:
            if r.status_code >= 400:
                r.read()
                raise CtlError(f"{r.status_code}: {_error_of(r.content)}")
            for raw in r.iter_lines():
                if not raw.strip():
                    continue
                data = orjson.loads(raw)
                if "error" in data:
                    raise CtlError(str(data["error"]))
                show.show(ProgressLine.model_validate(data))
    except httpx.ConnectError:
        raise CtlError(unreachable(client.url, client.source)) from None
    except httpx.HTTPError as exc:
        raise CtlError(f"the pull stopped: {exc} (pull again to go on from there)") from None


def _error_of(content: bytes) -> str:
    try:
        err = orjson.loads(content).get("error")
    except (ValueError, AttributeError):
        err = None
    if isinstance(err, dict):
        err = err.get("message")
    return str(err) if err else "request failed"


def here(target: PullTarget, models_dir: Path, show: Printer, endpoint: str | None) -> Path:
    """Pull in this process (no daemon answers); a failure is a CtlError."""
    try:
        return puller.pull(target, models_dir, Hub(endpoint), emit=show.show)
    except MlxdError as exc:
        raise CtlError(exc.message) from None


def daemon_answers(client: AdminClient) -> bool:
    try:
        client.http.get("/health", timeout=5.0)
    except httpx.HTTPError:
        return False
    return True


def pull(
    client: AdminClient, name: str, revision: str | None, home: Path, endpoint: str | None
) -> dict:
    """Pull `name` (a Hugging Face repository or a name of mlxd's table); what was pulled."""
    try:
        target = pull_target(name, revision)
    except MlxdError as exc:
        raise CtlError(exc.message) from None
    show = Printer()
    try:
        if daemon_answers(client):
            through_daemon(client, name, revision, show)
            return {"model": target.model_id, "repo": target.repo, "via": client.url}
        folder = here(target, home / "models", show, endpoint)
        return {"model": target.model_id, "repo": target.repo, "path": str(folder)}
    finally:
        show.close()
