"""aiohttp's own server log on the public port: a malformed request is one line, not a traceback.

aiohttp answers a request it cannot parse (an 8 KB header line, a broken request line) with a
400 and logs it with `logger.exception`: a full traceback per request, which anyone who can
connect could use to fill `mlxd.log`. The client's mistake is worth one line; a real failure
inside the server keeps its traceback.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

# The log line quotes aiohttp's message, which can repeat part of the client's request line.
DETAIL_CHARS = 200

SERVER_LOG = logging.getLogger("mlxd.http.server")


class OneLineBadRequests(logging.Filter):
    """Turns aiohttp's record of a request it could not parse into one plain warning line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            detail = (exc.message or type(exc).__name__).replace("\n", " ")[:DETAIL_CHARS]
            record.msg = "bad request %s from %s: %s"
            args = record.args if isinstance(record.args, tuple) else ()
            record.args = (exc.code, args[0] if args else "?", detail)
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


SERVER_LOG.addFilter(OneLineBadRequests())
