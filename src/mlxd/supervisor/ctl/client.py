"""mlxctl's HTTP client for the daemon's /admin API (sync httpx)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx


class CtlError(Exception):
    """A failure mlxctl reports as one line and a non-zero exit."""


class AdminClient:
    """Calls /admin on one daemon; every failure becomes a CtlError with a readable reason."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout_s: float = 600.0,
        transport: httpx.BaseTransport | None = None,
        source: str | None = None,
    ):
        self.url = url.rstrip("/")
        self.source = source  # what chose this daemon (ctl/target.py), named in errors
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout_s, transport=transport
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, path: str, **params: Any) -> dict:
        return self._call("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict | None = None) -> dict:
        return self._call("POST", path, body=body)

    def delete(self, path: str) -> dict:
        return self._call("DELETE", path)

    def _call(
        self, method: str, path: str, params: dict | None = None, body: dict | None = None
    ) -> dict:
        try:
            r = self.http.request(method, path, params=params, json=body)
        except httpx.ConnectError:
            raise CtlError(unreachable(self.url, self.source)) from None
        except httpx.TimeoutException:
            raise CtlError(f"mlxd at {self.url} did not answer in time") from None
        except httpx.HTTPError as exc:
            raise CtlError(f"request to {self.url} failed: {exc}") from None
        if r.status_code >= 400:
            raise CtlError(f"{r.status_code}: {error_message(r)}")
        try:
            return r.json()
        except ValueError:
            raise CtlError(
                f"mlxd at {self.url} answered {path} with something that is not JSON"
            ) from None


def unreachable(url: str, source: str | None) -> str:
    """The one line for a daemon that does not answer, naming what chose its URL."""
    via = f" (from {source})" if source else ""
    return f"cannot reach mlxd at {url}{via}: is it running? start it with `mlxd start`"


def error_message(r: httpx.Response) -> str:
    """The message of an OpenAI or Anthropic error envelope, else the status text."""
    try:
        body = r.json()
        message = body["error"]["message"]
        if isinstance(message, str) and message:
            return message
    except (ValueError, KeyError, TypeError):
        pass
    return r.reason_phrase or "request failed"


def model_path(model_id: str, action: str | None = None) -> str:
    """/admin/models/<id>[/<action>]; "/" inside an id stays a path separator."""
    path = f"/admin/models/{quote(model_id, safe='/')}"
    return f"{path}/{action}" if action else path
