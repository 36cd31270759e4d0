"""How a broken stream ends on each route (the supervisor's proxy when a worker dies
mid-stream, the worker's driver when a writer cannot write its own error event): the
official openai client raises the error, and every route has its terminator."""

from __future__ import annotations

import httpx
import openai
import orjson
import pytest

from mlxd.shared.errors import BadGateway, sse_error_bytes

ERR = BadGateway("The worker for 'a' stopped mid-stream")
CREATED = (
    b"event: response.created\ndata: "
    + orjson.dumps(
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": {
                "id": "resp_1",
                "object": "response",
                "created_at": 1,
                "status": "in_progress",
                "model": "a",
                "output": [],
            },
        }
    )
    + b"\n\n"
)


def _client(body: bytes) -> openai.OpenAI:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    transport = httpx.MockTransport(answer)
    return openai.OpenAI(
        base_url="http://mlxd/v1",
        api_key="k",
        http_client=httpx.Client(transport=transport),
        max_retries=0,
    )


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_an_openai_stream_ends_with_the_envelope_then_done(path):
    data = sse_error_bytes(ERR, path)
    assert data.endswith(b"\n\ndata: [DONE]\n\n")
    client = _client(data)
    with pytest.raises(openai.APIError, match="stopped mid-stream"):
        list(client.chat.completions.create(model="a", messages=[], stream=True))


def test_a_responses_stream_ends_with_an_error_event_the_sdk_raises_on():
    data = sse_error_bytes(ERR, "/v1/responses")
    assert data.startswith(b"event: error\ndata: ") and b"[DONE]" not in data
    event = orjson.loads(data.split(b"data: ")[1])
    assert event["type"] == "error" and event["code"] is None and "mid-stream" in event["message"]
    with pytest.raises(openai.APIError, match="stopped mid-stream"):
        list(_client(CREATED + data).responses.create(model="a", input="x", stream=True))
    with pytest.raises(openai.APIError, match="stopped mid-stream"):
        with _client(CREATED + data).responses.stream(model="a", input="x") as stream:
            stream.until_done()


def test_anthropic_and_ollama_streams_end_with_their_own_error():
    assert sse_error_bytes(ERR, "/v1/messages") == (
        b'event: error\ndata: {"type":"error","error":{"type":"api_error",'
        b'"message":"The worker for \'a\' stopped mid-stream"}}\n\n'
    )
    line = sse_error_bytes(ERR, "/api/chat")
    assert orjson.loads(line) == {"error": ERR.message} and line.endswith(b"}\n")
