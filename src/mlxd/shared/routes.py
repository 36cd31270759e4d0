"""The public generation routes, declared once: the supervisor's proxy, metrics, auth and
model-kind check and the worker's routes and kind guard all read this table.

A route is served by a worker at `worker_path`; `forwarded` routes pass through the
supervisor's generic proxy unchanged, the others have a handler of their own there (the
Responses store, Ollama's translations) that still ends at `worker_path`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["chat", "embedding", "transcription"]


@dataclass(frozen=True)
class Route:
    """One public generation route."""

    path: str
    kind: Kind  # the kind of model that serves it
    worker_path: str
    forwarded: bool


ROUTES: tuple[Route, ...] = (
    Route("/v1/chat/completions", "chat", "/v1/chat/completions", forwarded=True),
    Route("/v1/completions", "chat", "/v1/completions", forwarded=True),
    Route("/v1/messages", "chat", "/v1/messages", forwarded=True),
    Route("/v1/messages/count_tokens", "chat", "/v1/messages/count_tokens", forwarded=True),
    Route("/v1/responses", "chat", "/v1/responses", forwarded=False),
    Route("/v1/embeddings", "embedding", "/v1/embeddings", forwarded=True),
    Route("/v1/audio/transcriptions", "transcription", "/v1/audio/transcriptions", forwarded=False),
    Route("/v1/audio/translations", "transcription", "/v1/audio/translations", forwarded=False),
    Route("/api/chat", "chat", "/api/chat", forwarded=False),
    Route("/api/generate", "chat", "/api/generate", forwarded=False),
    Route("/api/embed", "embedding", "/v1/embeddings", forwarded=False),
    Route("/api/embeddings", "embedding", "/v1/embeddings", forwarded=False),
)
BY_PATH = {r.path: r for r in ROUTES}
PUBLIC_PATHS = frozenset(BY_PATH)
FORWARDED_PATHS = tuple(r.path for r in ROUTES if r.forwarded)
WORKER_PATHS = frozenset(r.worker_path for r in ROUTES)
# Worker routes an embedding model's worker refuses (and a chat model's, the embedding one).
WORKER_CHAT_PATHS = frozenset(r.worker_path for r in ROUTES if r.kind == "chat")
# Worker routes only a speech-to-text model's worker serves (multipart in, docs/api.md).
WORKER_AUDIO_PATHS = frozenset(r.worker_path for r in ROUTES if r.kind == "transcription")
# The kind of model each worker path serves (every route ending at one path is of one kind).
WORKER_KINDS: dict[str, Kind] = {r.worker_path: r.kind for r in ROUTES}

# Path areas and who may call them: the API key on the API, the admin token (or loopback) on
# the admin area.
API_AREAS = ("/v1", "/api")
ADMIN_AREAS = ("/admin", "/metrics")
# Ollama's routes that change what is on disk: the admin area's rule, not the API key's.
MANAGE_PATHS = ("/api/pull", "/api/push", "/api/create", "/api/copy", "/api/delete")


def in_area(path: str, areas: tuple[str, ...]) -> bool:
    """`path` is one of `areas` or under one of them."""
    return path in areas or path.startswith(tuple(a + "/" for a in areas))


def kind_of(path: str) -> Kind:
    """The kind of model a public or worker path needs (chat for any path not listed)."""
    route = BY_PATH.get(path)
    return route.kind if route is not None else WORKER_KINDS.get(path, "chat")
