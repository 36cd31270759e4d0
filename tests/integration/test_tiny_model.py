"""The tiny test model loads in mlx-lm and behaves like a real chat model."""

from __future__ import annotations

import hashlib
import json
import pathlib

import mlx.core as mx
import mlx_lm
import pytest
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.tokenizer_utils import TokenizerWrapper

from tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return mlx_lm.load(str(tiny_model_dir))


def _digest(folder: pathlib.Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}


def test_load_gives_tokenizer_wrapper_with_im_end_eos(loaded):
    _, tokenizer = loaded
    assert isinstance(tokenizer, TokenizerWrapper)
    im_end = tokenizer.encode("<|im_end|>", add_special_tokens=False)
    assert len(im_end) == 1
    assert im_end[0] in tokenizer.eos_token_ids
    assert tokenizer.eos_token_id == im_end[0]


def test_markers_are_single_tokens(loaded):
    _, tokenizer = loaded
    for marker in [
        "<|im_start|>",
        "<|endoftext|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
    ]:
        assert len(tokenizer.encode(marker, add_special_tokens=False)) == 1, marker


def test_parameter_count(loaded):
    model, _ = loaded
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    assert 2_000_000 <= n_params <= 8_000_000


def test_greedy_generation_is_repeatable(loaded):
    model, tokenizer = loaded
    prompt = mx.array(tokenizer.encode("The weather in Paris is"))

    def greedy_tokens() -> list[int]:
        steps = generate_step(prompt, model, max_tokens=20)
        return [int(token) for token, _ in steps]

    first = greedy_tokens()
    assert len(first) == 20
    assert first == greedy_tokens()
    assert len(set(first)) > 3  # random weights, but not stuck on one token
    text = mlx_lm.generate(model, tokenizer, "Hello", max_tokens=20)
    assert text and text == mlx_lm.generate(model, tokenizer, "Hello", max_tokens=20)


def test_tokenizer_round_trips_unicode(loaded):
    _, tokenizer = loaded
    s = "Hello, world! 123 café 😀"
    assert tokenizer.decode(tokenizer.encode(s, add_special_tokens=False)) == s


def test_chat_template_plain_turns(loaded):
    _, tokenizer = loaded
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_chat_template_tools_and_tool_turns(loaded):
    _, tokenizer = loaded
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    messages = [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 24C"},
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "Thanks"},
    ]
    rendered = tokenizer.apply_chat_template(
        messages, tools=[tool], tokenize=False, add_generation_prompt=True
    )
    assert rendered.startswith("<|im_start|>system\nYou help.\n\n# Tools")
    assert "<tools>\n" + json.dumps(tool, ensure_ascii=False) + "\n</tools>" in rendered
    assert (
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        in rendered
    )
    assert "<|im_start|>user\n<tool_response>\nsunny, 24C\n</tool_response><|im_end|>\n" in rendered
    assert "<|im_start|>assistant\nIt is sunny.<|im_end|>\n" in rendered
    assert rendered.endswith("<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n")


def test_build_is_deterministic(tmp_path, tiny_model_dir):
    again = build_tiny_model(tmp_path / "again", arch="llama", seed=0)
    assert _digest(again) == _digest(tiny_model_dir)
    other = _digest(build_tiny_model(tmp_path / "other", arch="llama", seed=1))
    assert other["model.safetensors"] != _digest(tiny_model_dir)["model.safetensors"]


def test_second_model_is_qwen3(tiny_model_dir_b):
    model, tokenizer = mlx_lm.load(str(tiny_model_dir_b))
    assert model.model_type == "qwen3"
    assert tokenizer.decode(tokenizer.encode("café 😀", add_special_tokens=False)) == "café 😀"
