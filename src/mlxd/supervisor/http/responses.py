"""The Responses API in the supervisor: the store, and POST/GET/DELETE /v1/responses.

POST expands `previous_response_id` into the full input (the stored turns, their output, then
the new input), forwards to the model's worker like any /v1 call, and stores the final
response: the parsed body, or the `response.completed` (or `.incomplete`/`.failed`) event of a
stream, whose chunks pass through untouched as they arrive. The worker stays stateless.
"""

from __future__ import annotations

import logging

import orjson
from aiohttp import web

from mlxd.shared.errors import NotFound, PayloadTooLarge
from mlxd.shared.wire.bodies import load_json, parse_model
from mlxd.shared.wire.responses import ResponsesRequest
from mlxd.supervisor.catalog.cards import check_route
from mlxd.supervisor.http.proxy import ADAPTER, ON_STREAM_CHUNK, forward_leased
from mlxd.supervisor.http.response_store import ResponseStore
from mlxd.supervisor.registry.adapters import check_mounted
from mlxd.supervisor.registry.registry import Registry

log = logging.getLogger("mlxd.responses")

STORE = "response_store"
FINAL_EVENTS = (
    b"event: response.completed",
    b"event: response.incomplete",
    b"event: response.failed",
)


def add_response_routes(app: web.Application) -> None:
    """Register before the generic /v1 proxy route, which would otherwise take POST."""
    settings = app["settings"]
    app[STORE] = ResponseStore(
        settings.home_dir / "responses" / "responses.sqlite3",
        ttl_s=settings.responses_ttl_s,
        max_bytes=settings.responses_max_bytes,
    )
    app.on_cleanup.append(_close_store)
    app.router.add_post("/v1/responses", create_response)
    app.router.add_get("/v1/responses/{response_id}", get_response)
    app.router.add_delete("/v1/responses/{response_id}", delete_response)
    app.router.add_get("/v1/responses/{response_id}/input_items", list_input_items)


async def _close_store(app: web.Application) -> None:
    app[STORE].close()


def _json(data, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(data), content_type="application/json")


def _stored(request: web.Request) -> dict:
    rid = request.match_info["response_id"]
    record = request.app[STORE].get(rid)
    if record is None:
        raise NotFound(f"No response with id '{rid}'", param="response_id")
    return record


async def create_response(request: web.Request) -> web.StreamResponse:
    reg: Registry = request.app["registry"]
    store: ResponseStore = request.app[STORE]
    data = load_json(await request.read())
    req = parse_model(ResponsesRequest, data)
    items = req.input_items()
    model = req.model
    if req.previous_response_id:
        prev = store.get(req.previous_response_id)
        if prev is None:
            raise NotFound(
                f"Previous response with id '{req.previous_response_id}' not found",
                param="previous_response_id",
            )
        items = prev["input"] + prev["response"].get("output", []) + items
        model = model or prev["response"].get("model")
    await reg.catalog.settle(model)
    entry, request[ADAPTER] = reg.catalog.route(model, data.get("adapter"))
    request["model"] = entry.id  # the metrics label, also when the lease fails
    check_mounted(reg, entry.id, request[ADAPTER])
    check_route(entry, reg.settings, request.path)  # an embedding model loads nothing
    # The stored response keeps the name the client used for an adapter ("base:adapter").
    named = model if request[ADAPTER] else entry.id
    body = orjson.dumps({**data, "model": named, "input": items})
    limit = reg.settings.max_body_bytes
    if req.previous_response_id and len(body) > limit:
        raise PayloadTooLarge(
            f"The conversation continued from '{req.previous_response_id}' is {len(body)} bytes "
            f"with its earlier turns (images included), over max_body_bytes ({limit}): start a "
            "new chain, or send the turns you need as `input`",
            param="previous_response_id",
        )
    capture = _FinalEvent()
    chained = request.get(ON_STREAM_CHUNK)
    request[ON_STREAM_CHUNK] = capture.chain(chained)
    log.info("responses model=%s request_id=%s", entry.id, request["request_id"])
    resp = await forward_leased(request, reg, entry.id, body)
    final = capture.response
    answer = resp.body if isinstance(resp, web.Response) else None
    if final is None and resp.status == 200 and isinstance(answer, bytes) and answer:
        final = _response_of(answer, whole=True)
    if final is not None and req.store and final.get("id"):
        store.put(final["id"], {"input": items, "response": final})
    return resp


async def get_response(request: web.Request) -> web.Response:
    return _json(_stored(request)["response"])


async def delete_response(request: web.Request) -> web.Response:
    rid = request.match_info["response_id"]
    if not request.app[STORE].delete(rid):
        raise NotFound(f"No response with id '{rid}'", param="response_id")
    return _json({"id": rid, "object": "response.deleted", "deleted": True})


async def list_input_items(request: web.Request) -> web.Response:
    items = _stored(request)["input"]
    return _json(
        {"object": "list", "data": items, "has_more": False, "first_id": None, "last_id": None}
    )


class _FinalEvent:
    """Watches a passing SSE stream for the event that carries the finished response."""

    def __init__(self):
        self._buf = b""
        self.response: dict | None = None

    def chain(self, other):
        """An ON_STREAM_CHUNK hook that feeds us and `other` (until `other` is done)."""
        state = {"other": other}

        def on_chunk(chunk: bytes) -> bool:
            if state["other"] is not None and state["other"](chunk):
                state["other"] = None
            self.feed(chunk)
            return False

        return on_chunk

    def feed(self, chunk: bytes) -> None:
        self._buf += chunk
        *events, self._buf = self._buf.split(b"\n\n")
        for ev in events:
            if ev.startswith(FINAL_EVENTS):
                for line in ev.split(b"\n"):
                    if line.startswith(b"data: "):
                        self.response = _response_of(line[6:])


def _response_of(data: bytes, whole: bool = False) -> dict | None:
    """The response in a final event's data (or a whole body); None, and not stored, when it
    does not parse: the client already has its answer, the store only loses a turn."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        log.warning("a finished response did not parse as JSON: not stored")
        return None
    if not isinstance(value, dict):
        return None
    found = value if whole else value.get("response")
    return found if isinstance(found, dict) else None
