"""The Ollama API through a real daemon, driven by the official `ollama` Python client.

One daemon serves the whole module (models "a" and "b", the tiny random models). Where the
random model must say something in particular (a tool call), the test adds mlxd's
`guided_regex` extension to the client's body through an httpx transport: the official client
has no extra-body option, and what comes back is parsed by it as usual.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import httpx
import jsonschema
import ollama
import pytest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
        },
    },
}
PARIS_CALL = re.escape(
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
HI = [{"role": "user", "content": "Say hi"}]
GREEDY = {"temperature": 0.0, "num_predict": 6}
# The tiny embedding model's fixture, where the embeddings worker is part of the tree.
EMBEDDING_FIXTURE = "tiny_embedding_dir"


class ExtraBody(httpx.HTTPTransport):
    """Adds fields to every JSON body the client sends."""

    def __init__(self, **extra):
        super().__init__()
        self.extra = extra

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = {**json.loads(request.read()), **self.extra}
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        forged = httpx.Request(request.method, request.url, headers=headers, json=body)
        return super().handle_request(forged)


@pytest.fixture(scope="module")
def daemon(make_module_daemon, tiny_model_dir, tiny_model_dir_b, request):
    models = {"a": tiny_model_dir, "b": tiny_model_dir_b}
    try:
        models["e"] = request.getfixturevalue(EMBEDDING_FIXTURE)
    except pytest.FixtureLookupError:
        pass
    return make_module_daemon(models=models)


@pytest.fixture(scope="module")
def client(daemon) -> ollama.Client:
    return ollama.Client(host=daemon.url, timeout=120)


def refusal(call) -> ollama.ResponseError:
    with pytest.raises(ollama.ResponseError) as e:
        call()
    return e.value


def test_probe_version_list_and_show(daemon, client):
    assert daemon.http.get("/").text == "Ollama is running"
    assert daemon.http.head("/").status_code == 200
    assert daemon.http.get("/api/version").json()["version"].count(".") == 2

    models = {m.model: m for m in client.list().models}
    assert {"a:latest", "b:latest"} <= set(models)
    a = models["a:latest"]
    assert a.size > 0 and len(a.digest) == 64 and a.modified_at.year >= 2024
    assert (a.details.family, models["b:latest"].details.family) == ("llama", "qwen3")
    assert a.details.parameter_size.endswith("M") and a.details.quantization_level == "F32"

    shown = client.show("a:latest")
    assert "<|im_start|>" in shown.template
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == 4096
    assert {"completion", "tools"} <= set(shown.capabilities)
    assert shown.details.family == "llama"

    missing = refusal(lambda: client.show("nope:latest"))
    assert missing.status_code == 404 and "nope" in missing.error


def test_chat_whole_and_streamed_say_the_same(client):
    whole = client.chat(model="a:latest", messages=HI, options=GREEDY)
    assert whole.done and whole.done_reason == "length"
    assert whole.eval_count == 6 and whole.prompt_eval_count > 0
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.total_duration >= whole.eval_duration > 0

    parts = list(client.chat(model="a", messages=HI, options=GREEDY, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert parts[-1].done_reason == "length" and parts[-1].eval_count == 6


def test_generate_whole_and_streamed_say_the_same(client):
    whole = client.generate(model="a", prompt="Once upon", system="Be brief", options=GREEDY)
    assert whole.done_reason == "length" and whole.eval_count == 6 and whole.response
    parts = list(
        client.generate(
            model="a", prompt="Once upon", system="Be brief", options=GREEDY, stream=True
        )
    )
    assert "".join(p.response for p in parts) == whole.response and parts[-1].done
    raw = client.generate(model="a", prompt="Once upon", raw=True, options=GREEDY)
    assert raw.eval_count == 6
    assert raw.prompt_eval_count < whole.prompt_eval_count  # no template around it


def test_format_json_and_a_schema(client):
    opts = {"num_predict": 40, "temperature": 0.0}
    r = client.generate(model="a", prompt="An object", format="json", options=opts)
    if r.done_reason == "stop":
        assert isinstance(json.loads(r.response), dict)
    else:  # the random model's strings run long: what it wrote is still an object's start
        assert r.response.startswith('{"')
    free = client.generate(model="a", prompt="An object", options=opts).response
    assert not free.startswith("{")  # the format made the difference
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["city", "sunny"],
        "properties": {"city": {"enum": ["Paris", "Rome"]}, "sunny": {"type": "boolean"}},
    }
    r = client.chat(model="a", messages=HI, format=schema, options={"num_predict": 80})
    assert r.done_reason == "stop"
    jsonschema.validate(json.loads(r.message.content), schema)


def test_tool_calls_come_back_as_message_tool_calls(daemon):
    forced = ollama.Client(
        host=daemon.url, timeout=120, transport=ExtraBody(guided_regex=PARIS_CALL)
    )
    r = forced.chat(model="a", messages=HI, tools=[WEATHER])
    (call,) = r.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", {"city": "Paris"})
    assert r.done_reason == "stop"

    streamed = list(forced.chat(model="a", messages=HI, tools=[WEATHER], stream=True))
    calls = [c for p in streamed for c in p.message.tool_calls or []]
    assert [c.function.arguments for c in calls] == [{"city": "Paris"}]

    answer = ollama.Client(
        host=daemon.url, timeout=120, transport=ExtraBody(guided_regex="Sunny and 24C")
    ).chat(
        model="a",
        messages=[
            *HI,
            r.message,
            {"role": "tool", "content": "sunny, 24C", "tool_name": "get_weather"},
        ],
        tools=[WEATHER],
    )
    assert answer.message.content == "Sunny and 24C" and not answer.message.tool_calls


def test_seed_num_predict_and_num_ctx(client):
    opts = {"temperature": 1.0, "seed": 7, "num_predict": 12}
    first = client.chat(model="a", messages=HI, options=opts)
    again = client.chat(model="a", messages=HI, options=opts)
    assert first.message.content == again.message.content
    assert first.eval_count == 12 and first.done_reason == "length"

    room = {"num_ctx": first.prompt_eval_count + 3, "num_predict": 50}
    cut = client.chat(model="a", messages=HI, options=room)
    assert cut.eval_count == 3 and cut.done_reason == "length"  # the window ran out first
    small = refusal(lambda: client.chat(model="a", messages=HI, options={"num_ctx": 4}))
    assert small.status_code == 400 and "num_ctx" in small.error


def test_refusals_in_ollamas_error_shape(daemon, client):
    image = [{"role": "user", "content": "What is this?", "images": [b"\x89PNG"]}]
    e = refusal(lambda: client.chat(model="a", messages=image))
    assert e.status_code == 400 and "model 'a' does not accept images" in e.error
    e = refusal(lambda: client.generate(model="a", prompt="x", images=[b"\x89PNG"]))
    assert e.status_code == 400 and "no vision capability" in e.error
    e = refusal(lambda: client.chat(model="nope", messages=HI))
    assert e.status_code == 404 and "nope" in e.error
    e = refusal(lambda: client.chat(model="a", messages=HI, options={"mirostat": 2}))
    assert e.status_code == 400 and "mirostat" in e.error
    e = refusal(lambda: client.chat(model="a", messages=HI, keep_alive="soon"))
    assert e.status_code == 400 and "keep_alive" in e.error
    e = refusal(lambda: client.push("a"))  # the other model routes: test_model_store.py
    assert e.status_code == 501 and "does not publish" in e.error
    assert daemon.http.get("/api/nothing").json() == {"error": "Unknown path '/api/nothing'"}


def running(client: ollama.Client) -> dict:
    return {m.model: m for m in client.ps().models}


def test_keep_alive_per_request(daemon, client):
    client.chat(model="b", messages=HI, keep_alive="1h", options={"num_predict": 2})
    loaded = running(client)["b:latest"]
    left = loaded.expires_at - datetime.now(timezone.utc)
    assert timedelta(minutes=55) < left <= timedelta(hours=1)
    assert loaded.size_vram > 0 and loaded.context_length == 4096

    client.generate(model="b", prompt="x", keep_alive=0, options={"num_predict": 2})
    daemon.wait_for(lambda: daemon.status("b")["status"] == "available", what="b unloaded")
    assert "b:latest" not in running(client)

    # No prompt: Ollama's "load" (keep_alive 0: "unload") requests.
    assert client.generate(model="b").done_reason == "load"
    assert "b:latest" in running(client)
    assert client.chat(model="b", messages=[], keep_alive=0).done_reason == "unload"
    assert "b:latest" not in running(client)
    states = {m["id"]: m["state"] for m in daemon.http.get("/admin/models").json()["data"]}
    assert states["b"] == "stopped"


def test_embed_needs_an_embedding_model(client):
    e = refusal(lambda: client.embed(model="a", input=["hello"]))
    assert 400 <= e.status_code < 500 and e.error


def test_embed_and_the_older_embeddings_route(daemon, client):
    if "e:latest" not in {m.model for m in client.list().models}:
        pytest.skip(f"no {EMBEDDING_FIXTURE} fixture here: the embedding worker is another change")
    r = client.embed(model="e:latest", input=["hello", "world"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == len(r.embeddings[1]) > 0
    assert r.prompt_eval_count > 0 and r.model == "e:latest"
    one = client.embeddings(model="e", prompt="hello").embedding
    assert one == pytest.approx(r.embeddings[0], abs=1e-4)
