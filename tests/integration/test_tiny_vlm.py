"""The tiny vision-language folders open in mlx-vlm and mlx-lm, images steer mlx-vlm's greedy
output, and mlx-lm's text model fed mlx-vlm's merged embeddings gives mlx-vlm's own tokens."""

from __future__ import annotations

import hashlib

import mlx.core as mx
import mlx_lm
import mlx_vlm
import pytest
from mlx_lm.generate import generate_step
from mlx_vlm.prompt_utils import get_chat_template
from mlx_vlm.utils import prepare_inputs, should_add_special_tokens
from tiny_vlm import FAMILIES, build_vlm, image, image_token_id, oracle

TOKENS = 16
TWO_IMAGES = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Compare"},
            {"type": "image"},
            {"type": "text", "text": "with"},
            {"type": "image"},
        ],
    }
]


def _one_image(text: str = "What is in the picture?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]


@pytest.fixture(scope="module", params=FAMILIES)
def folder(request, tmp_path_factory):
    return build_vlm(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture(scope="module")
def models(folder):
    vlm, processor = mlx_vlm.load(str(folder))
    lm, _ = mlx_lm.load(str(folder))
    return vlm, processor, lm


def _inputs(vlm, processor, messages, images):
    prompt = get_chat_template(processor, messages, add_generation_prompt=True)
    return prepare_inputs(
        processor,
        images=images,
        prompts=prompt,
        image_token_index=vlm.config.image_token_index,
        add_special_tokens=should_add_special_tokens(vlm.config.model_type, processor),
    )


def _merged(vlm, inputs) -> mx.array:
    """mlx-vlm's text-and-image embeddings, fresh: gemma3's text models scale them in place."""
    extra = {k: v for k, v in inputs.items() if k == "image_sizes"}
    out = vlm.get_input_embeddings(
        inputs["input_ids"], inputs["pixel_values"], mask=inputs["attention_mask"], **extra
    )
    mx.eval(out.inputs_embeds)
    return out.inputs_embeds


def _lm_greedy(lm, ids: list[int], embeddings: mx.array | None = None) -> list[int]:
    steps = generate_step(mx.array(ids), lm, max_tokens=TOKENS, input_embeddings=embeddings)
    return [int(tok) for tok, _ in steps]


def test_same_seed_same_bytes(tmp_path):
    a = build_vlm(tmp_path / "a", "mistral3", seed=3)
    b = build_vlm(tmp_path / "b", "mistral3", seed=3)
    assert {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in a.iterdir()} == {
        f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in b.iterdir()
    }


def test_template_places_the_image_marker_and_the_processor_expands_it(folder, models):
    vlm, processor, _ = models
    prompt = get_chat_template(processor, TWO_IMAGES, add_generation_prompt=True)
    marker = "<start_of_image>" if vlm.config.model_type == "gemma3" else "[IMG]"
    assert prompt.count(marker) == 2
    assert prompt.index("Compare") < prompt.index(marker) < prompt.index("with")
    text_only = get_chat_template(processor, [{"role": "user", "content": "hi"}], True)
    assert marker not in text_only

    ids, _ = oracle(folder, TWO_IMAGES, [image(1), image(2, (32, 16))], 1)
    # gemma3: 4 soft tokens an image; mistral3: one per 16 px square after merging.
    assert ids.count(image_token_id(folder)) == (8 if vlm.config.model_type == "gemma3" else 6)


def test_generation_depends_on_the_image(folder):
    outputs = [oracle(folder, _one_image(), [image(seed)], TOKENS)[1] for seed in (1, 2, 3)]
    assert all(outputs)
    assert len({tuple(o) for o in outputs}) == 3
    two = oracle(folder, TWO_IMAGES, [image(1), image(2)], TOKENS)[1]
    swapped = oracle(folder, TWO_IMAGES, [image(2), image(1)], TOKENS)[1]
    assert two != swapped


def test_text_only_mlx_lm_matches_mlx_vlm(folder, models):
    vlm, _, lm = models
    ids, want = oracle(folder, [{"role": "user", "content": "Hello there, how are you?"}], [], 16)
    x = mx.array([ids])
    diff = mx.abs(lm(x) - vlm.language_model(x).logits).max().item()
    assert diff <= 1e-4
    assert _lm_greedy(lm, ids)[: len(want)] == want


@pytest.mark.parametrize("count", [1, 2])
def test_mlx_lm_fed_merged_embeddings_reproduces_mlx_vlm(folder, models, count):
    vlm, processor, lm = models
    messages = _one_image() if count == 1 else TWO_IMAGES
    images = [image(5), image(6, (32, 16))][:count]
    inputs = _inputs(vlm, processor, messages, images)
    x = inputs["input_ids"]

    # Prefill logits: mlx-lm's model on the merged embeddings against mlx-vlm's language
    # model on the same (generate_step's path: no mask argument, so causal masks).
    ours = lm(x, input_embeddings=_merged(vlm, inputs))
    theirs = vlm.language_model(x, inputs_embeds=_merged(vlm, inputs)).logits
    assert mx.abs(ours - theirs).max().item() <= 1e-4

    ids, want = oracle(folder, messages, images, TOKENS)
    assert ids == x[0].tolist()
    assert _lm_greedy(lm, ids, _merged(vlm, inputs)[0])[: len(want)] == want


def test_gemma3_text_models_scale_the_callers_embeddings_in_place(folder, models):
    """A hazard for callers: gemma3's `h *= sqrt(hidden)` rewrites the array passed in."""
    vlm, processor, lm = models
    if vlm.config.model_type != "gemma3":
        pytest.skip("mistral3's text model leaves its input alone")
    inputs = _inputs(vlm, processor, _one_image(), [image(5)])
    emb = _merged(vlm, inputs)
    before = emb + 0
    mx.eval(lm(inputs["input_ids"], input_embeddings=emb), before)
    assert not mx.array_equal(emb, before).item()
    scale = mx.array(vlm.config.text_config.hidden_size**0.5, mx.bfloat16).astype(mx.float32)
    assert mx.allclose(emb, before * scale).item()
