"""Images through the real daemon: each surface's image form reaches the worker, and every
refusal is a 400 in that surface's envelope naming the image (issue #35). The tiny models
have no vision, so a well-formed image is refused naming the model."""

from __future__ import annotations

import base64

import pytest

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16).decode()
DATA_URL = f"data:image/png;base64,{PNG}"
NO_VISION = "model 'a' does not accept images: it has no vision capability"


@pytest.fixture(scope="module")
def d(make_module_daemon):
    return make_module_daemon()


def openai_image(url: str) -> list[dict]:
    part = {"type": "image_url", "image_url": {"url": url, "detail": "low"}}
    return [{"role": "user", "content": [{"type": "text", "text": "What is it?"}, part]}]


@pytest.mark.parametrize("stream", [False, True])
def test_openai_image_to_a_text_model_names_the_model(d, stream):
    body = {"model": "a", "messages": openai_image(DATA_URL), "stream": stream}
    r = d.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert NO_VISION in error["message"]
    assert error["param"] == "messages.0.content.1.image_url"


def test_openai_bad_image_is_a_400_naming_the_part(d):
    body = {"model": "a", "messages": openai_image("data:image/png;base64,@@@")}
    r = d.http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages.0.content.1.image_url"
    assert "not valid base64" in r.json()["error"]["message"]
    assert d.http.post(  # text-only requests are served as before
        "/v1/chat/completions",
        json={"model": "a", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
    ).is_success


def test_anthropic_images_in_anthropics_envelope(d):
    source = {"type": "base64", "media_type": "image/png", "data": PNG}
    msgs = [{"role": "user", "content": [{"type": "image", "source": source}]}]
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = d.http.post(path, json={"model": "a", "max_tokens": 5, "messages": msgs})
        assert r.status_code == 400
        assert r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "invalid_request_error"
        assert NO_VISION in r.json()["error"]["message"]
    bad = [{"role": "user", "content": [{"type": "image", "source": {**source, "data": "?"}}]}]
    r = d.http.post("/v1/messages", json={"model": "a", "max_tokens": 5, "messages": bad})
    assert r.status_code == 400 and "not valid base64" in r.json()["error"]["message"]


def test_responses_images(d):
    item = {"role": "user", "content": [{"type": "input_image", "image_url": DATA_URL}]}
    r = d.http.post("/v1/responses", json={"model": "a", "input": [item]})
    assert r.status_code == 400 and NO_VISION in r.json()["error"]["message"]
    item = {"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}
    r = d.http.post("/v1/responses", json={"model": "a", "input": [item]})
    assert r.status_code == 400 and "file ids are not supported" in r.json()["error"]["message"]
