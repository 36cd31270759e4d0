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


def test_a_conversation_about_an_image_survives_an_unload_from_the_ssd(make_daemon, gemma):
    """gemma3's sliding-window cache cannot be trimmed: the second turn's hit is the
    snapshot at the first turn's stable boundary, written to the SSD as the worker drained."""
    d = make_daemon(models={"g": gemma}, config="keep_alive_s = 0\n")
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
        gemma,
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
