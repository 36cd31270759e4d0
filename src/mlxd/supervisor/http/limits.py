"""Bounds on the public TCP server: descriptors, connections per client and in all, read timeouts.

Without them a few hundred slow or idle sockets exhaust the descriptor limit (256 by default on
macOS) and lock every other client out. Four bounds apply:
- the soft RLIMIT_NOFILE is raised at start, and the total cap kept below it;
- a connection over `max_connections_per_client` (per peer address) or `max_connections` is
  answered 429 / 503 before any request is read, then closed once the client has sent what it
  was sending (a close with its request unread would reset the connection: no answer at all);
- request headers must be complete within `header_timeout_s` of the connection opening or of the
  previous response ending (this is also how long an idle keep-alive connection is kept);
- a request body must arrive within `body_timeout_s`, else 408, and within `header_timeout_s`
  while its client (or the server) is crowded (body_deadline.py).
Responses are never timed out here: a stream may run for minutes.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable

import orjson
from aiohttp import web

from mlxd.shared.errors import MlxdError, TooManyRequests, Unavailable, openai_body

log = logging.getLogger("mlxd.limits")

NOFILE_TARGET = 65536
# macOS refuses a soft limit above OPEN_MAX (10240) unless the kernel limits were raised.
NOFILE_FALLBACK = 10240
# Descriptors kept for what is not a client connection: worker sockets and pipes, logs, the
# responses database, the SSD tier's files opened by this process.
RESERVED_FDS = 128
REFUSAL_LOG_EVERY_S = 10.0
# A refused connection is read (and what arrives dropped) until its client closes it, for at
# most LINGER_S; past MAX_LINGERING such connections at once, further ones are closed at once.
LINGER_S = 5.0
MAX_LINGERING = 64
# A client holding this share of its cap, or the server this share of its own: crowded.
CROWDED_SHARE = 0.75


def raise_nofile_limit(target: int = NOFILE_TARGET) -> tuple[int, int]:
    """Raise the soft descriptor limit toward min(hard, target); never lower it.

    Returns (before, after).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = target if hard == resource.RLIM_INFINITY else min(hard, target)
    for candidate in (want, min(want, NOFILE_FALLBACK)):
        if candidate <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (candidate, hard))
        except (ValueError, OSError):
            continue
        return soft, candidate
    return soft, soft


def connection_cap(max_connections: int, nofile: int) -> int:
    """The total connection cap that still leaves descriptors for the daemon's own files."""
    return max(16, min(max_connections, nofile - RESERVED_FDS))


class ConnectionLimiter:
    """Counts open connections in all and per client address; refuses over either cap."""

    def __init__(self, max_total: int, max_per_client: int):
        self.max_total = max_total
        self.max_per_client = max_per_client
        self.total = 0
        self.per_client: dict[str, int] = {}
        self.refused = 0
        self.lingering = 0  # refused connections still being read until their client closes
        self._refused_logged = 0
        self._last_log = float("-inf")

    def admit(self, client: str) -> MlxdError | None:
        """Count one more connection from `client`, or return why it is refused."""
        held = self.per_client.get(client, 0)
        if held >= self.max_per_client:
            return self._refuse(
                client,
                TooManyRequests(
                    f"Too many open connections from this client (limit {self.max_per_client})",
                    code="too_many_connections",
                ),
            )
        if self.total >= self.max_total:
            return self._refuse(
                client,
                Unavailable(
                    f"The server has too many open connections (limit {self.max_total})",
                    code="too_many_connections",
                ),
            )
        self.per_client[client] = held + 1
        self.total += 1
        return None

    def crowded(self, client: str) -> bool:
        """Whether `client`, or the server as a whole, holds most of its connections: a slow
        body then gets less time (body_deadline.py), so no one can hold the cap for long."""
        held = self.per_client.get(client, 0)
        return (
            held >= CROWDED_SHARE * self.max_per_client
            or self.total >= CROWDED_SHARE * self.max_total
        )

    def release(self, client: str) -> None:
        """Forget one connection from `client`."""
        self.total -= 1
        left = self.per_client.get(client, 0) - 1
        if left > 0:
            self.per_client[client] = left
        else:
            self.per_client.pop(client, None)

    def _refuse(self, client: str, err: MlxdError) -> MlxdError:
        self.refused += 1
        now = time.monotonic()
        # One line per interval: a flood of refusals must not become a flood of log lines.
        if now - self._last_log >= REFUSAL_LOG_EVERY_S:
            log.warning(
                "refused %d connection(s), latest from %s: %s",
                self.refused - self._refused_logged,
                client,
                err.message,
            )
            self._refused_logged = self.refused
            self._last_log = now
        return err


def refusal_bytes(err: MlxdError) -> bytes:
    """A complete HTTP/1.1 response for a connection refused before its request was read."""
    body = orjson.dumps(openai_body(err))
    reason = {429: "Too Many Requests", 503: "Service Unavailable"}.get(err.status, "Error")
    head = (
        f"HTTP/1.1 {err.status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class _GateProtocol(asyncio.Protocol):
    """Admits a connection through the limiter, then hands every event to aiohttp's handler."""

    def __init__(self, limiter: ConnectionLimiter, make_handler: Callable[[], asyncio.Protocol]):
        self._limiter = limiter
        self._make_handler = make_handler
        self._inner: asyncio.Protocol | None = None
        self._client = ""
        self._linger: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple | list) and peer else "?"
        refusal = self._limiter.admit(client)
        if refusal is not None:
            self._refuse(transport, refusal)  # type: ignore[arg-type]
            return
        self._client = client
        self._inner = self._make_handler()
        self._inner.connection_made(transport)

    def _refuse(self, transport: asyncio.WriteTransport, refusal: MlxdError) -> None:
        """Answer, then close once the client has sent its request: closing with it unread
        resets the connection, and a client still sending its body never reads the answer."""
        transport.write(refusal_bytes(refusal))
        if self._limiter.lingering >= MAX_LINGERING or not transport.can_write_eof():
            transport.close()
            return
        transport.write_eof()
        self._limiter.lingering += 1
        self._linger = asyncio.get_running_loop().call_later(LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)
        # Refused: what the client sends is dropped.

    def eof_received(self) -> bool | None:
        # Refused: the client has sent everything; returning False closes the connection.
        return self._inner.eof_received() if self._inner is not None else False

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
            self._limiter.lingering -= 1
        if self._inner is None:
            return
        inner, self._inner = self._inner, None
        self._limiter.release(self._client)
        inner.connection_lost(exc)


class GuardedTCPSite(web.BaseSite):
    """A TCP site like aiohttp's TCPSite whose connections pass a ConnectionLimiter first."""

    __slots__ = ("_host", "_port", "_limiter", "_bound_port")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        limiter: ConnectionLimiter,
        *,
        backlog: int = 128,
    ):
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self._limiter = limiter
        self._bound_port = port

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._bound_port}"

    @property
    def port(self) -> int:
        """The port listened on (the one the system chose when asked for port 0)."""
        return self._bound_port

    async def start(self) -> None:
        await super().start()  # registers the site with its runner, so cleanup stops it
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _GateProtocol(self._limiter, server),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=True,
        )
        if self._server.sockets:
            self._bound_port = self._server.sockets[0].getsockname()[1]
