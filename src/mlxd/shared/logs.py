"""Logging setup for both processes: readable lines on the terminal, JSON lines in the file.

Every line logged while a request is handled carries that request's id and model: the request
middleware binds them in a context variable and a filter copies them onto each record.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from datetime import datetime, timezone
from pathlib import Path

import orjson

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONTEXT_FIELDS = ("request_id", "model")

_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "mlxd_log_context", default=None
)


def bind_log_context(**fields: str | None) -> contextvars.Token:
    """Attach fields (request_id, model) to every record logged from this context on."""
    new = {k: v for k, v in fields.items() if v}
    return _context.set({**(_context.get() or {}), **new})


def reset_log_context(token: contextvars.Token) -> None:
    _context.reset(token)


class ContextFilter(logging.Filter):
    """Copies the bound request fields onto each record (fields passed in `extra` win)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_context.get() or {}).items():
            if getattr(record, key, None) is None:
                setattr(record, key, value)
        return True


class TextFormatter(logging.Formatter):
    """The readable terminal line, with request fields the message does not already name."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = [
            f"{k}={v}"
            for k in CONTEXT_FIELDS
            if (v := getattr(record, k, None)) and f"{k}={v}" not in line
        ]
        return f"{line} {' '.join(extra)}" if extra else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, request_id, model, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in CONTEXT_FIELDS:
            value = getattr(record, key, None)
            if value:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def setup_logging(level: str = "INFO", file: Path | None = None) -> None:
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(level.upper())
    term = logging.StreamHandler(sys.stderr)
    term.setFormatter(TextFormatter(FORMAT))
    term.addFilter(ContextFilter())
    root.addHandler(term)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(file)
        fh.setFormatter(JsonFormatter())
        fh.addFilter(ContextFilter())
        root.addHandler(fh)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
