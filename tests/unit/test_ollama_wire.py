"""The Ollama surface without MLX: its wire conversions, keep_alive per request over fake
workers, and the supervisor's /api routes in process (embeddings translated to and from the
worker's OpenAI shape, the API key, Ollama's error shape)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer
from fake_workers import FakeClock, Fleet, make_registry, settled

from mlxd.shared.errors import BadRequest
from mlxd.shared.wire.bodies import parse_model
from mlxd.shared.wire.keep_alive import keep_alive_seconds
from mlxd.shared.wire.ollama import ChatRequest, GenerateRequest, model_id_of
from mlxd.shared.wire.ollama_answers import ollama_name
from mlxd.supervisor.daemon import build_app
from mlxd.supervisor.lifecycle.states import State
from mlxd.supervisor.scheduling import keepalive

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "value,seconds",
    [
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("250ms", 0.25),
        ("0", 0.0),
        ("300", 300.0),
        (0, 0.0),
        (90, 90.0),
        (-1, -1.0),
        ("-5m", -1.0),  # negative: loaded for good
        ("inf", -1.0),
        ("100000000h", -1.0),  # past Go's longest duration: for good, not a date in year 13434
        (1e12, -1.0),
        (None, None),
    ],
)
def test_keep_alive_durations(value, seconds):
    assert keep_alive_seconds(value) == seconds


@pytest.mark.parametrize("value", ["5x", "", "m", "5 m", "1h-3m", "nan", True])
def test_a_bad_keep_alive_is_a_400_naming_it(value):
    with pytest.raises(BadRequest, match="keep_alive"):
        parse_model(ChatRequest, {"model": "a", "messages": HI, "keep_alive": value})


def test_model_names_map_to_ids_and_back():
    assert model_id_of("smollm2:latest") == "smollm2"
    assert model_id_of("org/name:q4") == "org/name:q4"  # another tag is part of the id
    assert ollama_name("smollm2") == "smollm2:latest"
    assert ollama_name("mlx-community/Qwen3-0.6B-4bit") == "mlx-community/Qwen3-0.6B-4bit:latest"


def test_options_map_onto_generation_params():
    options = {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.05,
        "seed": 3,
        "num_predict": 7,
        "stop": ["\n\n"],
        "repeat_penalty": 1.1,
        "num_ctx": 2048,
        "num_gpu": 99,  # placement options change nothing here: accepted, ignored
        "num_thread": 8,
        "mirostat": 0,
    }
    req = parse_model(
        ChatRequest, {"model": "a", "messages": HI, "options": options, "logprobs": True}
    )
    p = req.to_chat_job().params
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (0.5, 0.9, 20, 0.05, 3)
    assert (p.max_tokens, p.stop, p.repetition_penalty) == (7, ("\n\n",), 1.1)
    assert (p.context_window, p.logprobs) == (2048, True)
    unlimited = {"num_predict": -1, "seed": -1}
    p = parse_model(ChatRequest, {"model": "a", "messages": HI, "options": unlimited})
    assert (p.to_chat_job().params.max_tokens, p.to_chat_job().params.seed) == (None, None)


@pytest.mark.parametrize(
    "body,says",
    [
        ({"options": {"mirostat": 2}}, "mirostat"),
        ({"options": {"typical_p": 0.5}}, "typical_p"),
        ({"options": {"num_predict": 0}}, "num_predict"),
        ({"options": {"temperature": -1}}, "temperature"),
        ({"messages": [{"role": "user", "content": "x", "images": ["no*base64"]}]}, "images"),
        ({"format": "yaml"}, "format"),
        ({"format": "json", "guided_regex": "a+"}, "format"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"options": {"repeat_last_n": 100_000, "repeat_penalty": 1.2}}, "repeat_last_n"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_saying_so(body, says):
    with pytest.raises(BadRequest, match=says):
        parse_model(ChatRequest, {"model": "a", "messages": HI, **body}).to_chat_job()


@pytest.mark.parametrize("last_n,window", [(64, 64), (-1, 256), (0, 0), (None, None)])
def test_repeat_last_n_is_the_penalty_window(last_n, window):
    options = {"repeat_penalty": 1.1, **({"repeat_last_n": last_n} if last_n is not None else {})}
    req = parse_model(ChatRequest, {"model": "a", "messages": HI, "options": options})
    assert req.to_chat_job().params.penalty_window == window


def test_chat_history_tools_format_and_think_become_a_chat_job():
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    req = parse_model(
        ChatRequest,
        {
            "model": "a",
            "messages": [
                *HI,
                {"role": "assistant", "content": "", "thinking": "hm", "tool_calls": [call]},
                {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
            ],
            "tools": [tool],
            "format": {"type": "object"},
            "think": "high",
        },
    )
    job = req.to_chat_job()
    assistant, result = job.messages[1], job.messages[2]
    assert assistant["reasoning_content"] == "hm"
    assert assistant["tool_calls"][0]["function"] == call["function"]
    assert result == {"role": "tool", "content": "sunny", "name": "get_weather"}
    assert job.tools[0]["function"]["name"] == "get_weather"
    assert (job.guided.kind, job.guided.param) == ("json_schema", "format")
    assert job.template_kwargs == {"enable_thinking": True, "reasoning_effort": "high"}
    assert req.stream  # Ollama streams unless told not to


def test_generate_uses_the_template_unless_raw():
    req = parse_model(GenerateRequest, {"model": "a", "prompt": "Hi", "system": "Be brief"})
    job = req.to_chat_job()
    assert job.messages == [
        {"role": "system", "content": "Be brief"},
        {"role": "user", "content": "Hi"},
    ]
    raw = parse_model(GenerateRequest, {"model": "a", "prompt": "Hi", "raw": True})
    assert raw.to_chat_job().raw.value == "Hi"
    assert parse_model(GenerateRequest, {"model": "a"}).empty  # Ollama's "load" request
    for field in ({"suffix": "}"}, {"template": "{{ .Prompt }}"}, {"context": [1, 2]}):
        with pytest.raises(BadRequest):
            parse_model(GenerateRequest, {"model": "a", "prompt": "x", **field})


def test_a_requests_keep_alive_lasts_until_the_next_request(tmp_path):
    fleet, clock = Fleet(load_s=0), FakeClock()

    async def go():
        reg = make_registry(tmp_path, fleet, "m", clock=clock, keep_alive_s=-1)
        lc = reg.lifecycle
        async with reg.leases.lease("m", keep_alive_s=10) as slot:
            pass
        clock.advance(9)
        assert keepalive.expired(lc, clock()) == []
        clock.advance(1)
        assert keepalive.expired(lc, clock()) == [slot]
        async with reg.leases.lease("m"):  # no keep_alive: the configured -1 again
            pass
        clock.advance(10**6)
        assert keepalive.expired(lc, clock()) == []
        async with reg.leases.lease("m", keep_alive_s=0):
            pass
        await settled(slot, State.STOPPED)  # 0: unloaded as the request ended
        # The 0 went with the worker it unloaded: a later load keeps the configured -1.
        assert slot.keep_alive_s == -1
        async with reg.leases.lease("m"):
            pass
        clock.advance(10**6)
        assert keepalive.expired(lc, clock()) == []
        await reg.shutdown()

    asyncio.run(go())


class EmbeddingFleet(Fleet):
    """Fake workers whose /v1/embeddings answers like the embeddings worker (OpenAI shape)."""

    def __init__(self, status: int = 200):
        super().__init__(load_s=0)
        self.status = status
        self.bodies: list[dict] = []

    async def post_json(self, socket, path, timeout_s, body=None):
        if path != "/v1/embeddings":
            return await super().post_json(socket, path, timeout_s, body)
        self.bodies.append(body or {})
        if self.status != 200:
            return self.status, {"error": {"message": "not here", "type": "x"}}
        data = [{"embedding": [float(i), 0.5], "index": i} for i in range(len(body["input"]))]
        return 200, {"data": data[::-1], "usage": {"prompt_tokens": 4}}


def _call(tmp_path, fleet, requests, **settings):
    async def go():
        reg = make_registry(tmp_path, fleet, "e", **settings)
        app = build_app(reg.settings, reg)
        out = []
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            for method, path, body, headers in requests:
                r = await client.request(method, path, json=body, headers=headers or {})
                out.append((r.status, await r.json()))
        await reg.shutdown()
        return out

    return asyncio.run(go())


def test_embed_is_translated_to_and_from_the_workers_openai_shape(tmp_path):
    fleet = EmbeddingFleet()
    (embed, older, tags) = _call(
        tmp_path,
        fleet,
        [
            ("POST", "/api/embed", {"model": "e:latest", "input": ["x", "y"], "dimensions": 2}, 0),
            ("POST", "/api/embeddings", {"model": "e", "prompt": "x"}, None),
            ("GET", "/api/tags", None, None),
        ],
        models={"e": {"type": "embedding"}},  # the supervisor checks the kind before a lease
    )
    assert embed[0] == 200
    assert embed[1]["embeddings"] == [[0.0, 0.5], [1.0, 0.5]]  # by index, as sent
    assert (embed[1]["model"], embed[1]["prompt_eval_count"]) == ("e:latest", 4)
    assert fleet.bodies[0] == {"model": "e", "input": ["x", "y"], "dimensions": 2, "truncate": True}
    assert older == (200, {"embedding": [0.0, 0.5]})
    assert [m["name"] for m in tags[1]["models"]] == ["e:latest"]


def test_a_worker_without_embeddings_and_a_missing_key_answer_in_ollamas_shape(tmp_path):
    (no_route, no_key) = _call(
        tmp_path,
        EmbeddingFleet(status=404),
        [
            ("POST", "/api/embed", {"model": "e", "input": "x"}, {"Authorization": "Bearer k"}),
            ("GET", "/api/tags", None, None),
        ],
        api_key="k",
        models={"e": {"type": "embedding"}},  # an embedding model whose worker lacks the route
    )
    assert no_route == (400, {"error": "'e' does not support embeddings"})
    assert no_key[0] == 401 and set(no_key[1]) == {"error"}
