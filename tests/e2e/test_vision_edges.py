"""Images across the lifecycle and at the edges: a conversation about an image survives its
model's unload (the prompt cache drained to the SSD tier) and the next turn is mlx-vlm's own
answer from a cache that covers the image; odd but valid pictures answer, and a text that
spells the model's image marker is a 400 whatever the surface, the worker serving on."""

from __future__ import annotations

import base64
import io
import json

import pytest

pytest.importorskip("mlx_vlm", reason="mlx-vlm is not installed (make install puts it in)")

from tiny_vlm import build_vlm, image, oracle  # noqa: E402

TOKENS = 6
# Past the prompt cache's 256-token bar for an SSD restore (a shorter prefix is prefilled).
NOTES = " ".join(f"Note {i}: the keeper counted {i * 3} ships." for i in range(30))


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    return build_vlm(tmp_path_factory.mktemp("gemma3"), "gemma3")


def png(img, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=kw.pop("format", "PNG"), **kw)
    return buf.getvalue()


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def decoded(folder, messages: list[dict], imgs: list) -> str:
    """mlx-vlm's own greedy answer to `messages`, decoded, its end token left out."""
    from mlx_vlm.utils import load_processor

    _, ids = oracle(folder, messages, imgs, TOKENS)
    tok = load_processor(folder, add_detokenizer=False).tokenizer
    eos = json.loads((folder / "config.json").read_text()).get("eos_token_id")
    eos = set(eos if isinstance(eos, list) else [eos]) | {tok.eos_token_id}
    if ids and ids[-1] in eos:
        ids = ids[:-1]
    return tok.decode(ids)


@pytest.mark.parametrize("family", ["gemma3", "mistral3"])
def test_a_conversation_about_an_image_survives_an_unload_from_the_ssd(
    make_daemon, folders, family
):
    """gemma3's sliding-window cache cannot be trimmed: the second turn's hit is the
    snapshot at the first turn's stable boundary, written to the SSD as the worker drained
    (mistral3's plain KV trims to any prefix)."""
    folder = folders[family]
    d = make_daemon(models={"g": folder}, config="keep_alive_s = 0\n")
    img = image(31)
    url = data_url(png(img))
    user = [
        {"type": "text", "text": NOTES},
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What?"},
    ]
    oai = d.openai()
    first = oai.chat.completions.create(
        model="g", messages=[{"role": "user", "content": user}], max_tokens=TOKENS, temperature=0
    )
    said = first.choices[0].message.content
    d.wait_for(lambda: d.status("g")["status"] == "available", 20, "unload after keep-alive 0")
    assert not d.worker_pids("g")
    assert list((d.home / "cache").rglob("*.safetensors"))
    messages = [
        {"role": "user", "content": user},
        {"role": "assistant", "content": said},
        {"role": "user", "content": "Say more."},
    ]
    second = oai.chat.completions.create(
        model="g", messages=messages, max_tokens=TOKENS, temperature=0
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 2, (cached, first.usage)  # the image is in
    want = decoded(
        folder,
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": NOTES},
                    {"type": "image"},
                    {"type": "text", "text": "What?"},
                ],
            },
            {"role": "assistant", "content": said},
            {"role": "user", "content": [{"type": "text", "text": "Say more."}]},
        ],
        [img],
    )
    assert second.choices[0].message.content == want


@pytest.fixture(scope="module")
def folders(tmp_path_factory, gemma):
    return {"gemma3": gemma, "mistral3": build_vlm(tmp_path_factory.mktemp("m3"), "mistral3")}


@pytest.fixture(scope="module")
def d(module_daemon, folders, tiny_model_dir):
    return module_daemon(models={**folders, "chat": tiny_model_dir})


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def openai_body(model: str, text: str, data: bytes, **kw) -> dict:
    content = [
        {"type": "image_url", "image_url": {"url": data_url(data)}},
        {"type": "text", "text": text},
    ]
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": TOKENS,
        "temperature": 0,
        **kw,
    }


def anthropic_body(model: str, text: str, data: bytes) -> dict:
    src = {"type": "base64", "media_type": "image/png", "data": b64(data)}
    content = [{"type": "image", "source": src}, {"type": "text", "text": text}]
    return {
        "model": model,
        "max_tokens": TOKENS,
        "messages": [{"role": "user", "content": content}],
    }


def responses_body(model: str, text: str, data: bytes) -> dict:
    content = [
        {"type": "input_image", "image_url": data_url(data)},
        {"type": "input_text", "text": text},
    ]
    return {
        "model": model,
        "max_output_tokens": TOKENS,
        "input": [{"role": "user", "content": content}],
    }


def ollama_chat_body(model: str, text: str, data: bytes) -> dict:
    msg = {"role": "user", "content": text, "images": [b64(data)]}
    return {"model": model, "messages": [msg], "stream": False}


def ollama_generate_body(model: str, text: str, data: bytes) -> dict:
    return {"model": model, "prompt": text, "images": [b64(data)], "stream": False}


SURFACES = {
    "/v1/chat/completions": openai_body,
    "/v1/messages": anthropic_body,
    "/v1/messages/count_tokens": anthropic_body,
    "/v1/responses": responses_body,
    "/api/chat": ollama_chat_body,
    "/api/generate": ollama_generate_body,
}
MARKERS = {"gemma3": ["<start_of_image>", "<image_soft_token>"], "mistral3": ["[IMG]"]}


@pytest.mark.parametrize("family", ["gemma3", "mistral3"])
def test_a_text_spelling_the_image_marker_is_a_400_on_every_surface(d, family):
    pid = d.worker_pids(family)
    data = png(image(32))
    for marker in MARKERS[family]:
        for path, body in SURFACES.items():
            r = d.http.post(path, json=body(family, f"What is {marker} this?", data))
            assert r.status_code == 400, (marker, path, r.status_code, r.text[:300])
            assert "Traceback" not in r.text
    assert d.worker_pids(family) == pid or not pid
    ok = d.http.post("/v1/chat/completions", json=openai_body(family, "Fine?", data))
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("path", list(SURFACES))
def test_images_to_a_text_only_model_are_a_400_naming_it_on_every_surface(d, path):
    r = d.http.post(path, json=SURFACES[path]("chat", "What is it?", png(image(33))))
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert "'chat'" in r.text and "vision" in r.text, r.text[:300]


def odd_images() -> dict[str, bytes]:
    import numpy as np
    from PIL import Image

    rgb = image(34, (24, 24))
    gray16 = Image.fromarray((np.arange(24 * 24).reshape(24, 24) * 97 % 65536).astype(np.uint16))
    return {
        "1x1": png(image(35, (1, 1))),
        "1x4000": png(image(36, (1, 4000))),
        "4000x1": png(image(37, (4000, 1))),
        "2x3000": png(image(38, (3000, 2))),
        "grayscale": png(rgb.convert("L")),
        "gray+alpha": png(rgb.convert("LA")),
        "palette": png(rgb.convert("P")),
        "palette+transparency": png(rgb.convert("P"), transparency=0),
        "rgba": png(rgb.convert("RGBA")),
        "16-bit": png(gray16),
        "cmyk-jpeg": png(rgb.convert("CMYK"), format="JPEG"),
        "1-bit": png(rgb.convert("1")),
    }


@pytest.mark.parametrize("family", ["gemma3", "mistral3"])
def test_odd_but_valid_pictures_are_answered(d, family):
    pid = d.worker_pids(family)
    bad = {}
    for name, data in odd_images().items():
        r = d.http.post("/v1/chat/completions", json=openai_body(family, "What?", data))
        if r.status_code != 200:
            bad[name] = (r.status_code, r.text[:300])
    assert not bad, bad
    assert d.worker_pids(family) == pid or not pid


def streamed_text(path: str, body: str) -> str:
    """The answer's text out of a surface's stream (SSE or Ollama's NDJSON)."""
    out = []
    for line in body.splitlines():
        line = line.removeprefix("data: ").strip()
        if not line.startswith("{"):
            continue
        ev = json.loads(line)
        if path == "/v1/chat/completions":
            out += [c["delta"].get("content") or "" for c in ev.get("choices", [])]
        elif path == "/v1/messages":
            if ev.get("type") == "content_block_delta" and ev["delta"].get("type") == "text_delta":
                out.append(ev["delta"]["text"])
        elif path == "/v1/responses":
            if ev.get("type") == "response.output_text.delta":
                out.append(ev["delta"])
        elif path == "/api/chat":
            out.append(ev.get("message", {}).get("content", ""))
        else:
            out.append(ev.get("response", ""))
    return "".join(out)


def test_image_rows_stream_on_every_surface_with_the_plain_answer(d):
    data = png(image(39))
    plain = d.http.post("/v1/chat/completions", json=openai_body("gemma3", "Hm?", data)).json()
    want = plain["choices"][0]["message"]["content"]
    assert want
    for path, body in SURFACES.items():
        if path.endswith("count_tokens"):
            continue
        req = body("gemma3", "Hm?", data)
        req["stream"] = True
        if path in ("/api/chat", "/api/generate"):
            req["options"] = {"temperature": 0, "num_predict": TOKENS}
        else:
            req["temperature"] = 0
        with d.http.stream("POST", path, json=req) as r:
            assert r.status_code == 200, (path, r.read()[:300])
            text = streamed_text(path, r.read().decode())
        assert text == want, (path, text, want)


def test_logprobs_json_schema_and_tools_on_an_image_row(d):
    data = png(image(40))
    r = d.http.post(
        "/v1/chat/completions",
        json=openai_body("mistral3", "Hm?", data, logprobs=True, top_logprobs=2),
    )
    assert r.status_code == 200, r.text[:300]
    lp = r.json()["choices"][0]["logprobs"]["content"]
    assert lp and all(len(e["top_logprobs"]) == 2 for e in lp)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    r = d.http.post(
        "/v1/chat/completions",
        json=openai_body("mistral3", "Hm?", data, response_format=fmt, max_tokens=40),
    )
    assert r.status_code == 200, r.text[:300]
    content = r.json()["choices"][0]["message"]["content"]
    if r.json()["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(content)["a"], int), content
    else:
        assert content.startswith('{"a"') or content.startswith("{"), content
    tools = [
        {
            "type": "function",
            "function": {"name": "f", "parameters": schema},
        }
    ]
    r = d.http.post(
        "/v1/chat/completions",
        json=openai_body("gemma3", "Hm?", data, tools=tools, tool_choice="required", max_tokens=40),
    )
    assert r.status_code == 200, r.text[:300]
    # the tiny template has no tool-call format: described as text, the model left to choose
    assert "tool" in r.headers.get("warning", ""), r.headers


def test_an_anthropic_tool_result_image_is_seen(d):
    data = png(image(41))
    src = {"type": "base64", "media_type": "image/png", "data": b64(data)}
    msgs = [
        {"role": "user", "content": "Take a screenshot."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "here"}, {"type": "image", "source": src}],
                }
            ],
        },
    ]
    tools = [{"name": "shot", "input_schema": {"type": "object", "properties": {}}}]
    body = {
        "model": "gemma3",
        "max_tokens": TOKENS,
        "temperature": 0,
        "messages": msgs,
        "tools": tools,
    }
    r = d.http.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text[:300]
    other = {**src, "data": b64(png(image(42)))}
    msgs[2]["content"][0]["content"][1]["source"] = other
    r2 = d.http.post("/v1/messages", json=body)
    assert r2.status_code == 200, r2.text[:300]
    assert r.json()["content"] != r2.json()["content"]  # the screenshot was seen


@pytest.mark.parametrize("family", ["gemma3", "mistral3"])
def test_concurrent_image_requests_all_answer(d, family):
    """The processor runs in threads of the worker's event loop, several at once."""
    from concurrent.futures import ThreadPoolExecutor

    bodies = [openai_body(family, f"Look {i}?", png(image(100 + i, (48, 40)))) for i in range(12)]
    with ThreadPoolExecutor(12) as pool:
        got = list(pool.map(lambda b: d.http.post("/v1/chat/completions", json=b), bodies))
    bad = [(r.status_code, r.text[:200]) for r in got if r.status_code != 200]
    assert not bad, bad
    # the same request alone gives the same answer as it did in the crowd
    alone = d.http.post("/v1/chat/completions", json=bodies[5]).json()
    assert (
        alone["choices"][0]["message"]["content"]
        == got[5].json()["choices"][0]["message"]["content"]
    )


@pytest.mark.parametrize("family", ["gemma3", "mistral3"])
def test_a_second_turn_with_a_second_image_is_mlx_vlms_answer(d, folders, family):
    """Turn two re-sends the first image and the reply (its generated ids spliced back from
    the cache) and adds another image after them: the answer is mlx-vlm's for the chat."""
    a, b = image(130), image(131)
    first_user = [
        {"type": "image_url", "image_url": {"url": data_url(png(a))}},
        {"type": "text", "text": "What?"},
    ]
    oai = d.openai()
    first = oai.chat.completions.create(
        model=family,
        messages=[{"role": "user", "content": first_user}],
        max_tokens=TOKENS,
        temperature=0,
    )
    said = first.choices[0].message.content
    second_user = [
        {"type": "text", "text": "And"},
        {"type": "image_url", "image_url": {"url": data_url(png(b))}},
    ]
    second = oai.chat.completions.create(
        model=family,
        messages=[
            {"role": "user", "content": first_user},
            {"role": "assistant", "content": said},
            {"role": "user", "content": second_user},
        ],
        max_tokens=TOKENS,
        temperature=0,
    )
    assert second.usage.prompt_tokens_details.cached_tokens > first.usage.prompt_tokens // 2
    want = decoded(
        folders[family],
        [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": said},
            {"role": "user", "content": [{"type": "text", "text": "And"}, {"type": "image"}]},
        ],
        [a, b],
    )
    assert second.choices[0].message.content == want


def test_image_only_messages_and_the_image_count_bound(d):
    data = png(image(140))
    only = {"type": "image_url", "image_url": {"url": data_url(data)}}
    body = {"model": "mistral3", "messages": [{"role": "user", "content": [only]}]}
    r = d.http.post("/v1/chat/completions", json={**body, "max_tokens": 3})
    assert r.status_code == 200, r.text[:300]
    r = d.http.post(
        "/api/chat",
        json={
            "model": "gemma3",
            "messages": [{"role": "user", "content": "", "images": [b64(data)]}],
            "stream": False,
            "options": {"num_predict": 3},
        },
    )
    assert r.status_code == 200, r.text[:300]
    many = [
        {"type": "image_url", "image_url": {"url": data_url(png(image(150 + i)))}}
        for i in range(17)
    ]
    r = d.http.post(
        "/v1/chat/completions",
        json={
            "model": "gemma3",
            "messages": [{"role": "user", "content": many[:16]}],
            "max_tokens": 3,
        },
    )
    assert r.status_code == 200, r.text[:300]
    r = d.http.post(
        "/v1/chat/completions",
        json={"model": "gemma3", "messages": [{"role": "user", "content": many}], "max_tokens": 3},
    )
    assert r.status_code == 400 and "image_max_count" in r.text, r.text[:300]
    sys_img = [
        {"role": "system", "content": [only]},
        {"role": "user", "content": "Hi"},
    ]
    r = d.http.post(
        "/v1/chat/completions", json={"model": "gemma3", "messages": sys_img, "max_tokens": 3}
    )
    assert r.status_code == 400 and "user messages only" in r.text, r.text[:300]
