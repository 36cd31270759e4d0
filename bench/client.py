"""The load generator's side: one streamed chat completion, timed from the client.

Every server is driven through the same code path: aiohttp, `stream: true`,
`stream_options.include_usage`, so the only difference between two figures is the server.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson


class BenchError(RuntimeError):
    """A server answered something a benchmark cannot use (an error, a short stream)."""


@dataclass
class Target:
    """One server under test, as the client reaches it."""

    name: str  # "mlxd", "worker" or "mlx_lm"
    label: str  # what the report calls it, e.g. "mlxd (supervisor, TCP)"
    base_url: str  # "http://127.0.0.1:PORT", or "http://worker" for a UNIX socket
    unix_socket: str | None = None
    model: str | None = None  # the `model` field to send; None leaves it out
    extra_body: dict[str, Any] = field(default_factory=dict)

    def session(self) -> aiohttp.ClientSession:
        """A session able to hold every concurrent stream a workload opens."""
        if self.unix_socket:
            connector = aiohttp.UnixConnector(path=self.unix_socket, limit=0)
        else:
            connector = aiohttp.TCPConnector(limit=0)
        # No total timeout: a long generation is not an error; a silent server is.
        timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
        return aiohttp.ClientSession(base_url=self.base_url, connector=connector, timeout=timeout)


@dataclass
class StreamResult:
    """What one streamed request measured."""

    ttft_s: float  # request sent -> first chunk with generated text
    duration_s: float  # request sent -> end of stream
    completion_tokens: int  # from the usage chunk (or content chunks when there is none)
    prompt_tokens: int | None
    text: str
    counted_from_usage: bool
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, if sent

    @property
    def decode_tps(self) -> float:
        """Tokens per second after the first one: the streaming rate a reader sees."""
        span = self.duration_s - self.ttft_s
        return (
            (self.completion_tokens - 1) / span if span > 0 and self.completion_tokens > 1 else 0.0
        )


async def stream_chat(
    session: aiohttp.ClientSession,
    target: Target,
    messages: list[dict[str, Any]],
    max_tokens: int,
    logit_bias: dict[str, float] | None = None,
    model: str | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> StreamResult:
    """Send one streamed chat completion and time it. `model` overrides the target's."""
    body: dict[str, Any] = {
        "messages": messages,
        **({"tools": tools} if tools else {}),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **target.extra_body,
    }
    if model or target.model:
        body["model"] = model or target.model
    if logit_bias:
        body["logit_bias"] = logit_bias
    payload = orjson.dumps(body)
    t0 = time.monotonic()
    ttft = done = None
    text_parts: list[str] = []
    content_chunks = 0
    usage = None
    async with session.post(
        "/v1/chat/completions", data=payload, headers={"Content-Type": "application/json"}
    ) as resp:
        if resp.status != 200:
            raise BenchError(f"{target.name}: HTTP {resp.status}: {(await resp.text())[:300]}")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators and keep-alive comments
            data = line[5:].strip()
            if data == b"[DONE]":
                # Read on to the end of the body rather than hang up: an early close is a
                # client disconnect to the server, and the connection could not be reused.
                done = time.monotonic()
                continue
            event = orjson.loads(data)
            if "error" in event:
                raise BenchError(f"{target.name}: stream error: {event['error']}")
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    if ttft is None:
                        ttft = time.monotonic() - t0
                    content_chunks += 1
                    text_parts.append(content)
    duration = (done or time.monotonic()) - t0
    if ttft is None:  # nothing printable came back (e.g. only special tokens)
        ttft = duration
    if usage is not None:
        tokens, prompt = int(usage["completion_tokens"]), usage.get("prompt_tokens")
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    else:
        tokens, prompt, cached = content_chunks, None, None
    return StreamResult(
        ttft_s=ttft,
        duration_s=duration,
        completion_tokens=tokens,
        prompt_tokens=prompt,
        text="".join(text_parts),
        counted_from_usage=usage is not None,
        cached_tokens=cached,
    )
