"""Embeddings and model cards through a real daemon, driven by the official `openai` SDK.

One daemon for the module: a chat model, a Qwen3-Embedding-style model (detected from its
sentence-transformers files), and a chat folder configured as `type = "embedding"`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
from tokenizers import Tokenizer

TEXTS = ["The quick brown fox.", "Hello, world!", "Water boils at 100 degrees.", "a b c d e f"]
CONFIG = """
[models.qe]
context_limit = 64

[models.forced]
type = "embedding"
"""


@pytest.fixture(scope="module")
def d(module_daemon, tiny_model_dir, tiny_model_dir_b, tiny_embedding_dir):
    models = {"chat": tiny_model_dir, "qe": tiny_embedding_dir, "forced": tiny_model_dir_b}
    return module_daemon(models=models, config=CONFIG)


@pytest.fixture(scope="module")
def oai(d):
    return d.openai()


@pytest.fixture(scope="module")
def ids(tiny_embedding_dir):
    tok = Tokenizer.from_file(str(tiny_embedding_dir / "tokenizer.json"))
    return [tok.encode(t).ids for t in TEXTS]


def _states(d) -> dict[str, str]:
    return {m["id"]: m["state"] for m in d.http.get("/admin/models").json()["data"]}


def _vectors(resp) -> np.ndarray:
    assert [e.index for e in resp.data] == list(range(len(resp.data)))
    return np.array([e.embedding for e in resp.data], np.float32)


def test_wrong_kinds_and_unknown_paths_load_nothing(d, oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.embeddings.create(model="chat", input="hi")
    assert e.value.code == "model_type_mismatch" and 'type = "embedding"' in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="qe", messages=[{"role": "user", "content": "hi"}])
    assert "/v1/embeddings" in e.value.message
    body = {"model": "qe", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    r = d.http.post("/v1/messages", json=body)
    assert r.status_code == 400 and r.json()["type"] == "error"
    for path in ("/v1/nothing", "/v1/embeddings/x", "/v1/embedding"):
        r = d.http.post(path, json={"model": "chat", "input": "hi"})
        assert r.status_code == 404 and path in r.json()["error"]["message"]
    assert set(_states(d).values()) == {"stopped"}


def test_model_cards(oai):
    cards = {m.id: m for m in oai.models.list().data}
    chat, qe, forced = cards["chat"], cards["qe"], cards["forced"]
    assert (chat.type, chat.context_length, chat.architecture) == ("chat", 4096, "LlamaForCausalLM")
    assert chat.capabilities == ["completion", "tools", "reasoning"]
    assert chat.size_bytes > 0 and chat.quantization is None and chat.dtype == "float32"
    assert chat.status == "available"
    assert (qe.type, qe.context_length, qe.capabilities) == ("embedding", 64, ["embedding"])
    assert (qe.embedding_dimensions, qe.pooling) == (256, "last")
    assert forced.type == "embedding"
    one = oai.models.retrieve("qe")
    assert one.model_dump() == qe.model_dump()


def test_embeddings_shapes_formats_batching_and_determinism(oai, ids):
    batched = oai.embeddings.create(model="qe", input=TEXTS)  # the SDK asks for base64
    assert batched.model == "qe" and batched.object == "list"
    assert batched.usage.prompt_tokens == batched.usage.total_tokens == sum(map(len, ids))
    vecs = _vectors(batched)
    assert vecs.shape == (4, 256)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    floats = _vectors(oai.embeddings.create(model="qe", input=TEXTS, encoding_format="float"))
    assert np.array_equal(floats, vecs)  # the same float32 values either way
    single = np.stack([_vectors(oai.embeddings.create(model="qe", input=t))[0] for t in TEXTS])
    np.testing.assert_allclose(single, vecs, atol=1e-5)
    assert np.array_equal(_vectors(oai.embeddings.create(model="qe", input=TEXTS)), vecs)
    assert np.abs(vecs[0] - vecs[1]).max() > 1e-2
    # Token ids: one list, or a list of lists, embed as their text does.
    np.testing.assert_allclose(
        _vectors(oai.embeddings.create(model="qe", input=ids[0]))[0], vecs[0], atol=1e-5
    )
    np.testing.assert_allclose(
        _vectors(oai.embeddings.create(model="qe", input=ids)), vecs, atol=1e-5
    )
    short = _vectors(oai.embeddings.create(model="qe", input=TEXTS, dimensions=32))
    expect = vecs[:, :32] / np.linalg.norm(vecs[:, :32], axis=1, keepdims=True)
    np.testing.assert_allclose(short, expect, atol=1e-5)


def test_concurrent_requests_get_their_own_vectors(oai):
    def first(text: str) -> np.ndarray:
        return _vectors(oai.embeddings.create(model="qe", input=[text, "x"]))[0]

    alone = [first(t) for t in TEXTS]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(first, TEXTS))
    np.testing.assert_allclose(np.stack(together), np.stack(alone), atol=1e-5)


@pytest.mark.parametrize(
    "extra, param, words",
    [
        ({"input": "hi", "dimensions": 257}, "dimensions", "256 dimensions"),
        ({"input": [[1] * 65]}, "input", "64 tokens"),
        ({"input": [5, 999999]}, "input", "token id"),
        ({"input": ""}, "input", "empty"),
        ({"input": "hi", "encoding_format": "int8"}, "encoding_format", "float"),
    ],
)
def test_bad_requests_are_400s_naming_the_limit(d, extra, param, words):
    r = d.http.post("/v1/embeddings", json={"model": "qe", **extra})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"]


def test_truncate_cuts_long_inputs_to_the_context(d, oai, tiny_embedding_dir):
    long_text = " ".join(TEXTS * 8)
    r = d.http.post("/v1/embeddings", json={"model": "qe", "input": long_text, "truncate": True})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 64
    # The text's end marker (what last-token pooling reads) survives the cut.
    full = Tokenizer.from_file(str(tiny_embedding_dir / "tokenizer.json")).encode(long_text).ids
    kept = _vectors(oai.embeddings.create(model="qe", input=[full[:63] + full[-1:]]))[0]
    cut = np.array(r.json()["data"][0]["embedding"], np.float32)
    np.testing.assert_allclose(cut, kept, atol=1e-5)
    r = d.http.post("/v1/embeddings", json={"model": "qe", "input": long_text})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_a_chat_folder_configured_as_embedding_model(d, oai):
    vec = _vectors(oai.embeddings.create(model="forced", input="Hello"))[0]
    assert vec.shape == (256,) and abs(float(np.linalg.norm(vec)) - 1) < 1e-5
    with pytest.raises(openai.BadRequestError):
        oai.completions.create(model="forced", prompt="hi", max_tokens=2)
    assert _states(d) == {"chat": "stopped", "qe": "ready", "forced": "ready"}
