"""Embedding parts without MLX: forward planning, a folder's facts, the wire body."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from mlxd.shared.errors import BadRequest
from mlxd.shared.model_facts import kind_refusal, read_model_facts
from mlxd.shared.wire.bodies import parse_model
from mlxd.shared.wire.embeddings import EmbeddingRequest, embedding_list_bytes
from mlxd.worker.embed.plan import plan_forwards


def test_forwards_cover_every_input_once_within_the_budget():
    lengths = [5, 300, 2, 40, 40, 1000, 7, 64]
    plan = plan_forwards(lengths, token_budget=128, max_rows=3)
    seen = []
    for f in plan:
        if f.chunked:
            continue
        assert len(f.indices) <= 3
        assert len(f.indices) * max(lengths[i] for i in f.indices) <= 128
        seen += f.indices
    chunks = {
        i: [(f.start, f.stop) for f in plan if f.chunked and f.indices == (i,)] for i in (1, 5)
    }
    assert chunks[1] == [(0, 128), (128, 256), (256, None)]
    assert len(chunks[5]) == 8 and chunks[5][-1] == (896, None)
    assert sorted(seen) == [0, 2, 3, 4, 6, 7]


def _folder(tmp_path, name="m", config=None, **files):
    d = tmp_path / name
    d.mkdir()
    base = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64}
    (d / "config.json").write_text(json.dumps({**base, **(config or {})}))
    for rel, body in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(body if isinstance(body, str) else json.dumps(body))
    return d


def test_kind_and_pooling_come_from_the_folder(tmp_path):
    chat = read_model_facts(_folder(tmp_path, "chat", {"max_position_embeddings": 40960}))
    assert (chat.type, chat.context_length) == ("chat", 40960)
    pooling = {"pooling_mode_mean_tokens": True}
    st = _folder(
        tmp_path,
        "st",
        **{
            "modules.json": [{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}],
            "1_Pooling/config.json": pooling,
        },
    )
    assert (read_model_facts(st).type, read_model_facts(st).pooling) == ("embedding", "mean")
    named = read_model_facts(_folder(tmp_path, "x"), name="Qwen/Qwen3-Embedding-0.6B")
    assert (named.type, named.pooling) == ("embedding", "last")
    bert = read_model_facts(_folder(tmp_path, "b", {"model_type": "bert", "architectures": []}))
    assert bert.type == "embedding" and bert.encoder_only
    assert "encoder" in kind_refusal(bert, "b", "embedding")
    forced = read_model_facts(_folder(tmp_path, "f"), override="embedding")
    assert forced.type == "embedding"
    assert read_model_facts(st, override="chat").type == "chat"


def test_capabilities_and_quantization(tmp_path):
    template = "{% if tools %}{{ tools }}{% endif %}<think>{{ messages }}"
    d = _folder(
        tmp_path,
        "q",
        {"quantization": {"group_size": 64, "bits": 4}, "vision_config": {}},
        **{"tokenizer_config.json": {"chat_template": template}},
    )
    facts = read_model_facts(d)
    assert facts.capabilities == ["completion", "tools", "reasoning"]
    assert facts.quantization == {"bits": 4, "group_size": 64, "mode": "affine"}
    assert not facts.vision  # a qwen3 with a vision tower: not a family mlxd serves images to
    assert read_model_facts(_folder(tmp_path, "plain")).capabilities == ["completion"]
    vlm = read_model_facts(_folder(tmp_path, "v", {"model_type": "gemma3", "vision_config": {}}))
    assert vlm.vision and vlm.capabilities == ["completion", "vision"]


def test_wrong_kind_refusals_say_what_to_do(tmp_path):
    chat = read_model_facts(_folder(tmp_path, "c"))
    assert kind_refusal(chat, "c", "chat") is None
    assert 'type = "embedding"' in kind_refusal(chat, "c", "embedding")
    emb = read_model_facts(_folder(tmp_path, "e"), override="embedding")
    assert "/v1/embeddings" in kind_refusal(emb, "e", "chat")


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": []}, "input"),
        ({"input": ["a", ""]}, "input"),
        ({"input": [[1, 2], []]}, "input"),
        ({"input": ["a", 3]}, "input"),
        ({"input": [True]}, "input"),
        ({"input": ["a"] * 2049}, "input"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({}, "input"),
    ],
)
def test_bad_embedding_bodies_name_their_field(body, param):
    with pytest.raises(BadRequest) as e:
        parse_model(EmbeddingRequest, body)
    assert e.value.param == param


def test_inputs_and_encodings():
    one = parse_model(EmbeddingRequest, {"input": [1, 2, 3]})
    assert one.inputs() == [[1, 2, 3]]
    assert parse_model(EmbeddingRequest, {"input": "hi"}).inputs() == ["hi"]
    assert parse_model(EmbeddingRequest, {"input": [[1], [2, 3]]}).inputs() == [[1], [2, 3]]
    v = np.array([0.1, -2.5, 3.0], np.float32)
    floats = json.loads(embedding_list_bytes([v], "m", 4, "float"))
    b64 = json.loads(embedding_list_bytes([v], "m", 4, "base64"))
    assert floats["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    assert floats["data"][0] == {"object": "embedding", "embedding": [0.1, -2.5, 3.0], "index": 0}
    decoded = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), "<f4")
    assert decoded.tolist() == np.float32(floats["data"][0]["embedding"]).tolist()
