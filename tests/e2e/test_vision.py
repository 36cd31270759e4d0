"""Images through a real daemon: tiny random-weight VLMs of two families (tests/tiny_vlm.py,
mlx-vlm's own model classes), the official openai, anthropic and ollama clients.

Random weights write garbage, so the oracle is mlx-vlm's own greedy generation on the same
chat and image: the daemon's answer must be its tokens, decoded. A text-only model given an
image, and every image of the bad-image corpus, is a 400 in the surface's own envelope, and
the worker serves on.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib

import anthropic
import openai
import pytest

pytest.importorskip("mlx_vlm", reason="mlx-vlm is not installed (make install puts it in)")

from tiny_vlm import FAMILIES, build_vlm, image, oracle  # noqa: E402

TOKENS = 8


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {f: build_vlm(tmp_path_factory.mktemp(f), f) for f in FAMILIES}


@pytest.fixture(scope="module")
def d(module_daemon, folders, tiny_model_dir):
    return module_daemon(models={**folders, "chat": tiny_model_dir})


def png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def data_url(img) -> str:
    return "data:image/png;base64," + base64.b64encode(png(img)).decode()


def want_text(folder, text: str, imgs: list) -> str:
    """mlx-vlm's own greedy answer to one user turn (`imgs` first, then `text`), decoded."""
    from mlx_vlm.utils import load_processor

    parts = [{"type": "image"} for _ in imgs] + [{"type": "text", "text": text}]
    _, ids = oracle(folder, [{"role": "user", "content": parts}], imgs, TOKENS)
    tok = load_processor(folder, add_detokenizer=False).tokenizer
    eos = json.loads((folder / "config.json").read_text()).get("eos_token_id")
    eos = set(eos if isinstance(eos, list) else [eos]) | {tok.eos_token_id}
    if ids and ids[-1] in eos:  # the end token: never part of the answer's text
        ids = ids[:-1]
    return tok.decode(ids)


def ask_openai(d, model: str, text: str, imgs: list, **kw):
    content = [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in imgs]
    content.append({"type": "text", "text": text})
    return d.openai().chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": content}],
        max_tokens=TOKENS,
        temperature=0,
        **kw,
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_openai_image_answers_are_mlx_vlms_own(d, folders, family):
    img = image(11)
    got = ask_openai(d, family, "What is in this picture?", [img])
    assert got.choices[0].message.content == want_text(
        folders[family], "What is in this picture?", [img]
    )
    other = ask_openai(d, family, "What is in this picture?", [image(12)])
    assert other.choices[0].message.content != got.choices[0].message.content  # teeth


def test_models_list_the_vision_capability(d):
    cards = {c["id"]: c for c in d.http.get("/v1/models").json()["data"]}
    show = d.http.post("/api/show", json={"model": "gemma3"}).json()
    assert "vision" in show["capabilities"]
    assert "vision" not in d.http.post("/api/show", json={"model": "chat"}).json()["capabilities"]
    assert set(cards) >= {"gemma3", "mistral3", "chat"}


def test_anthropic_and_ollama_images_give_the_same_answer(d, folders):
    img = image(13)
    want = want_text(folders["gemma3"], "Describe it.", [img])
    b64 = base64.b64encode(png(img)).decode()
    client = anthropic.Anthropic(base_url=d.url, api_key="none", max_retries=0)
    msg = client.messages.create(
        model="gemma3",
        max_tokens=TOKENS,
        extra_body={"temperature": 0},
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": b64},
                    },
                    {"type": "text", "text": "Describe it."},
                ],
            }
        ],
    )
    assert "".join(b.text for b in msg.content if b.type == "text") == want
    import ollama

    out = ollama.Client(host=d.url).chat(
        model="gemma3",
        messages=[{"role": "user", "content": "Describe it.", "images": [png(img)]}],
        options={"temperature": 0, "num_predict": TOKENS},
    )
    assert out.message.content == want


def test_a_second_turn_about_the_same_image_is_served_from_the_cache(d, folders):
    img = image(14)
    first = ask_openai(d, "gemma3", "What is it?", [img])
    content = [
        {"type": "image_url", "image_url": {"url": data_url(img)}},
        {"type": "text", "text": "What is it?"},
    ]
    messages = [
        {"role": "user", "content": content},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Say more."},
    ]
    second = d.openai().chat.completions.create(
        model="gemma3", messages=messages, max_tokens=TOKENS, temperature=0
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > first.usage.prompt_tokens // 2, (cached, first.usage)
    # The same text with another image shares only what comes before that image.
    other = ask_openai(d, "gemma3", "What is it?", [image(15)])
    assert other.usage.prompt_tokens_details.cached_tokens < 12


def _png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(ihdr))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
    )


def bad_images() -> dict[str, str]:
    good = png(image(16))
    gif = io.BytesIO()
    image(17).save(gif, format="GIF", save_all=True, append_images=[image(18)])
    return {
        "truncated": "data:image/png;base64," + base64.b64encode(good[: len(good) // 2]).decode(),
        "bomb": "data:image/png;base64," + base64.b64encode(_png_header(60000, 60000)).decode(),
        "magic": "data:image/png;base64," + base64.b64encode(b"%PDF-1.4 not an image").decode(),
        "not base64": "data:image/png;base64,@@@@",
        "huge": "data:image/png;base64," + "A" * (30 * 1024 * 1024),
    }


def test_bad_images_are_400s_and_the_worker_serves_on(d):
    oai = d.openai()
    pid = d.worker_pids("gemma3")
    for name, url in bad_images().items():
        with pytest.raises(openai.APIStatusError) as e:
            oai.chat.completions.create(
                model="gemma3",
                messages=[
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}
                ],
                max_tokens=2,
            )
        assert e.value.status_code in (400, 413), (name, e.value)
        assert "Traceback" not in str(e.value.body) and "/work" not in str(e.value.body), name
    assert d.worker_pids("gemma3") == pid  # the same worker, alive
    assert ask_openai(d, "gemma3", "Still there?", [image(19)]).choices[0].message.content


def test_a_text_only_model_given_an_image_names_the_model_and_the_capability(d):
    with pytest.raises(openai.BadRequestError) as e:
        ask_openai(d, "chat", "What is it?", [image(20)])
    assert "'chat'" in e.value.message and "vision" in e.value.message


def test_anthropic_count_tokens_counts_an_images_tokens(d):
    body = {
        "model": "gemma3",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Describe it."}]}],
    }
    plain = d.http.post("/v1/messages/count_tokens", json=body).json()["input_tokens"]
    b64 = base64.b64encode(png(image(21))).decode()
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
    body["messages"][0]["content"].insert(0, img)
    with_image = d.http.post("/v1/messages/count_tokens", json=body).json()["input_tokens"]
    assert with_image > plain  # the image's own tokens (4 features plus its markers here)
