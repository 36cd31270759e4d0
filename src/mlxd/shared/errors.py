"""Domain errors and the wire error envelopes (OpenAI, Anthropic, and Ollama's on /api).

Handlers raise these; one middleware per process maps them to a response, so clients never
see a traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

import orjson


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice `word` most likely meant: the same but for case, else the nearest spelling,
    else the shortest choice that contains it ("smollm2" → "smollm2-135m-instruct")."""
    by_lower = {c.lower(): c for c in choices}
    w = word.lower()
    if w in by_lower:
        return by_lower[w]
    near = difflib.get_close_matches(w, by_lower, n=1)
    if near:
        return by_lower[near[0]]
    if len(w) >= 3:  # shorter words are contained in too much to mean anything
        holders = sorted((c for lower, c in by_lower.items() if w in lower), key=len)
        if holders:
            return holders[0]
    return None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """The closest choice as " (did you mean 'x'?)", or "" when none is close."""
    near = closest(word, choices)
    return f" (did you mean '{near}'?)" if near is not None else ""


class MlxdError(Exception):
    """Base of every error a client may see. `status` is the HTTP status."""

    status = 500
    type = "server_error"
    anthropic_type = "api_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        # When set, the response carries `Retry-After` (whole seconds): the wait is temporary.
        self.retry_after_s = retry_after_s


class BadRequest(MlxdError):
    status = 400
    type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class Unauthorized(MlxdError):
    status = 401
    type = "authentication_error"
    anthropic_type = "authentication_error"


class NotFound(MlxdError):
    status = 404
    type = "not_found_error"
    anthropic_type = "not_found_error"


class ModelNotFound(NotFound):
    """An id no model has; `known` are the ids (and aliases) the closest is suggested from."""

    def __init__(self, model: str, known: Iterable[str] = ()):
        super().__init__(
            f"The model '{model[:200]}' does not exist{did_you_mean(model, known)}",
            param="model",
            code="model_not_found",
        )


class MethodNotAllowed(MlxdError):
    status = 405
    type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class Conflict(MlxdError):
    """Another operation on the same thing is under way (a model being pulled or deleted)."""

    status = 409
    type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class PayloadTooLarge(MlxdError):
    status = 413
    type = "invalid_request_error"
    anthropic_type = "request_too_large"


class RequestTimeout(MlxdError):
    """The client did not send its request body in time."""

    status = 408
    type = "invalid_request_error"
    anthropic_type = "invalid_request_error"


class TooManyRequests(MlxdError):
    status = 429
    type = "rate_limit_error"
    anthropic_type = "rate_limit_error"


class BadGateway(MlxdError):
    status = 502
    type = "server_error"
    anthropic_type = "api_error"


class Unavailable(MlxdError):
    """Full queue, out of memory, a model that cannot start: retry later."""

    status = 503
    type = "server_error"
    anthropic_type = "overloaded_error"


def openai_body(err: MlxdError) -> dict[str, Any]:
    """The OpenAI error envelope."""
    return {
        "error": {
            "message": err.message,
            "type": err.type,
            "param": err.param,
            "code": err.code,
        }
    }


def anthropic_body(err: MlxdError) -> dict[str, Any]:
    """The Anthropic error envelope."""
    return {"type": "error", "error": {"type": err.anthropic_type, "message": err.message}}


def is_anthropic_path(path: str) -> bool:
    """Anthropic clients expect their own envelope on /v1/messages*."""
    return path.startswith("/v1/messages")


def ollama_body(err: MlxdError) -> dict[str, Any]:
    """Ollama's error shape: the message alone."""
    return {"error": err.message}


def is_ollama_path(path: str) -> bool:
    """Ollama clients read `{"error": "..."}` on /api/*."""
    return path == "/api" or path.startswith("/api/")


def error_bytes(err: MlxdError, path: str) -> bytes:
    """Serialize `err` in the envelope the route's API uses."""
    if is_ollama_path(path):
        return orjson.dumps(ollama_body(err))
    body = anthropic_body(err) if is_anthropic_path(path) else openai_body(err)
    return orjson.dumps(body)


def sse_error_bytes(err: MlxdError, path: str) -> bytes:
    """What ends a broken stream, in the route's envelope, with the route's terminator: one
    NDJSON line on the Ollama API, Anthropic's `error` event, the Responses API's `error`
    event (it has no [DONE]; the envelope rides along, which the openai SDK raises on), else
    the OpenAI envelope and `data: [DONE]`."""
    if is_ollama_path(path):
        return orjson.dumps(ollama_body(err)) + b"\n"
    if is_anthropic_path(path):
        return b"event: error\ndata: " + orjson.dumps(anthropic_body(err)) + b"\n\n"
    if path.startswith("/v1/responses"):
        body = openai_body(err)
        event = {**body["error"], "type": "error", "sequence_number": 0, **body}
        return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"
    return b"data: " + orjson.dumps(openai_body(err)) + b"\n\ndata: [DONE]\n\n"
