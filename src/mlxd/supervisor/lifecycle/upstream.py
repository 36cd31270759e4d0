"""HTTP clients over each worker's UNIX socket (one pooled session per socket)."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from pydantic import ValidationError

from mlxd.shared.wire.admin import WorkerHealth


class UpstreamPool:
    """One keep-alive aiohttp session per worker socket."""

    def __init__(self):
        self._sessions: dict[Path, aiohttp.ClientSession] = {}

    def session(self, socket: Path) -> aiohttp.ClientSession:
        s = self._sessions.get(socket)
        if s is None or s.closed:
            conn = aiohttp.UnixConnector(path=str(socket), limit=0)
            # No total timeout: streams last as long as generation does.
            s = aiohttp.ClientSession(
                connector=conn,
                base_url="http://worker",
                timeout=aiohttp.ClientTimeout(total=None, connect=10),
                auto_decompress=False,
            )
            self._sessions[socket] = s
        return s

    async def get_json(self, socket: Path, path: str, timeout_s: float) -> tuple[int, dict]:
        async with self.session(socket).get(
            path, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as r:
            try:
                return r.status, await r.json(content_type=None)
            except ValueError:
                return r.status, {}

    async def health(self, socket: Path, timeout_s: float) -> tuple[int, WorkerHealth]:
        """GET /health; an answer that is not a health body reads as status "unknown"."""
        status, body = await self.get_json(socket, "/health", timeout_s)
        try:
            return status, WorkerHealth.model_validate(body)
        except ValidationError:
            return status, WorkerHealth(status="unknown")

    async def post_json(
        self, socket: Path, path: str, timeout_s: float, body: dict | None = None
    ) -> tuple[int, dict]:
        async with self.session(socket).post(
            path, json=body or {}, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as r:
            try:
                return r.status, await r.json(content_type=None)
            except ValueError:
                return r.status, {}

    async def close(self, socket: Path) -> None:
        s = self._sessions.pop(socket, None)
        if s is not None:
            await s.close()

    async def close_all(self) -> None:
        for socket in list(self._sessions):
            await self.close(socket)
