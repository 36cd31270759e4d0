"""GGUF import of each supported architecture and tensor type, on tiny files built by
tests/gguf_fixtures.py with gguf's own writer (no download, no built-in model needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from mlx_lm import generate, load
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import _get_classes

from mlxd.worker.importers.gguf import GGUFImportError, import_gguf

from gguf_fixtures import CHAT_TEMPLATE, mlx_config, write_gguf, write_metadata_only

QUANT_TYPES = {
    "token_embd": T.Q8_0,
    "attn_q.": T.Q4_0,
    "attn_k.": T.Q8_0,
    "attn_v": T.Q4_1,
    "attn_output": T.Q5_0,
    "ffn_gate": T.Q4_K,
    "ffn_up": T.Q4_K,
    "ffn_down": T.Q6_K,
}


def _logits(model, ids: mx.array) -> np.ndarray:
    return np.array(model(ids, cache=make_prompt_cache(model)).astype(mx.float32))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"])
def test_architecture_imports_to_the_same_model(tmp_path, arch):
    ref = write_gguf(tmp_path / "m.gguf", arch, tied=arch != "phi3")
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "models")
    model, tokenizer = load(str(folder))
    dtype = model.model.embed_tokens.weight.dtype  # float16, bfloat16 for Gemma
    model.set_dtype(mx.float32)

    # mlx-lm's own model on the reference weights, rounded as the import rounds them
    config = mlx_config(arch, len(tokenizer.vocab), arch != "phi3")
    model_class, args_class = _get_classes(config)
    expected = model_class(args_class.from_dict(config))
    weights = {k: mx.array(v).astype(dtype).astype(mx.float32) for k, v in ref.items()}
    expected.load_weights(list(getattr(expected, "sanitize", lambda w: w)(weights).items()))

    ids = mx.array([tokenizer.encode("Hello, world! The weather in Paris is sunny.")])
    want, got = _logits(expected, ids), _logits(model, ids)
    assert np.abs(want - got).max() < 1e-2 * np.abs(want).max()
    assert json.loads((folder / "config.json").read_text())["model_type"] == config["model_type"]


def test_qwen3_with_k_quants_loads_and_generates(tmp_path):
    path = tmp_path / "qwen3-q4_k_m.gguf"
    write_gguf(path, "qwen3", QUANT_TYPES)
    folder = import_gguf(path, tmp_path / "models", "tiny-qwen3")
    config = json.loads((folder / "config.json").read_text())
    quant = config["quantization"]
    assert (quant["group_size"], quant["bits"]) == (32, 4)  # Q4_0 / Q4_1 / Q4_K layers
    for layer in range(2):
        for name, bits in (("mlp.down_proj", 8), ("self_attn.k_proj", 8), ("self_attn.o_proj", 8)):
            assert quant[f"model.layers.{layer}.{name}"] == {"group_size": 32, "bits": bits}

    # every imported weight is the GGUF tensor's value: exact for the repacked block types,
    # within the MLX grid's rounding for the re-quantized ones
    reader = gguf.GGUFReader(path)
    weights = mx.load(str(folder / "model.safetensors"))
    tolerance = {T.Q4_0: 1e-3, T.Q4_1: 1e-3, T.Q8_0: 1e-3, T.Q4_K: 0.08, T.Q5_0: 0.01, T.Q6_K: 0.01}
    checked = set()
    for t in reader.tensors:
        if t.tensor_type not in tolerance:
            continue
        want = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).reshape(
            t.data.shape[0], -1
        )
        path_ = _mlx_path(t.name)
        b = quant.get(path_, quant)["bits"]
        got = mx.dequantize(
            weights[f"{path_}.weight"],
            weights[f"{path_}.scales"],
            weights[f"{path_}.biases"],
            group_size=32,
            bits=b,
        )
        err = np.abs(np.array(got.astype(mx.float32)) - want).max() / np.abs(want).max()
        assert err < tolerance[t.tensor_type], (t.name, t.tensor_type.name, err)
        checked.add(t.tensor_type)
    assert checked == set(tolerance)

    model, tokenizer = load(str(folder))
    model.set_dtype(mx.float32)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    text = generate(model, tokenizer, prompt, max_tokens=6)
    assert isinstance(text, str) and len(tokenizer.encode(text)) >= 1
    assert tokenizer.chat_template == CHAT_TEMPLATE


def _mlx_path(gguf_name: str) -> str:
    names = {
        "token_embd": "model.embed_tokens",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    parts = gguf_name.removesuffix(".weight").split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{names[parts[2]]}"
    return names[parts[0]]


def _cli(*argv: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "mlxd.worker.importers.gguf", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=os.environ)


def test_cli_progress_overwrite_and_refusals(tmp_path):
    models = tmp_path / "models"
    write_gguf(tmp_path / "a.gguf", "qwen2", {"ffn": T.Q4_K}, basename="SmolLM2", size_label="1.7B")
    args = [str(tmp_path / "a.gguf"), "--models-dir", str(models), "--id", "m"]
    first = _cli(*args)
    assert first.returncode == 0, first.stderr
    assert Path(first.stdout.strip().splitlines()[-1]) == models / "m"
    # stderr is no terminal here: plain progress lines, ending at 100%
    assert "importing a.gguf: " in first.stderr and "(100%)" in first.stderr

    again = _cli(*args)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [
        f"error: {models / 'm'} already exists (pass --overwrite to replace it)"
    ]
    # a SmolLM2 other than the built-in 135M gets its model card's sampling
    gen = json.loads((models / "m" / "generation_config.json").read_text())
    assert (gen["do_sample"], gen["temperature"], gen["top_p"]) == (True, 0.2, 0.9)
    before = (models / "m" / "model.safetensors").stat().st_mtime_ns
    replaced = _cli(*args, "--overwrite", "--progress", "none")
    assert replaced.returncode == 0 and replaced.stderr == ""
    assert (models / "m" / "model.safetensors").stat().st_mtime_ns != before

    write_metadata_only(tmp_path / "b.gguf", "starcoder2")
    refused = _cli(str(tmp_path / "b.gguf"), "--models-dir", str(models))
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("error: unsupported architecture 'starcoder2'; supported: ")
    assert "qwen3" in line and "gemma3" in line
    assert sorted(p.name for p in models.iterdir()) == ["m"]  # nothing half-written


def test_unsupported_tensor_type_is_named(tmp_path):
    path = tmp_path / "iq.gguf"
    write_gguf(path, "llama", {"ffn_down": T.IQ2_XXS})
    with pytest.raises(GGUFImportError, match=r"unsupported tensor type IQ2_XXS \(tensor blk\.0"):
        import_gguf(path, tmp_path / "models")
    assert list((tmp_path / "models").glob("*")) == []


def _llama3_factors(factor: float, dims: int = 64, base: float = 10000.0) -> np.ndarray:
    # llama.cpp's converter: per-frequency factors of the Llama 3.1 recipe (low 1, high 4, 8192)
    wavelens = 2 * np.pi * base ** (np.arange(0, dims, 2) / dims)
    smooth = (8192 / wavelens - 1) / 3
    mid = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelens > 8192, factor, np.where(wavelens < 8192 / 4, 1.0, mid))


def test_llama3_rope_factors_become_mlx_lm_rope_scaling(tmp_path):
    write_gguf(tmp_path / "l3.gguf", "llama", extra={"rope_freqs.weight": _llama3_factors(8.0)})
    folder = import_gguf(tmp_path / "l3.gguf", tmp_path / "models")
    scaling = json.loads((folder / "config.json").read_text())["rope_scaling"]
    assert scaling["rope_type"] == "llama3" and scaling["factor"] == 8.0
    load(str(folder))  # mlx-lm builds its Llama 3 rope from it

    odd = _llama3_factors(8.0) ** 0.5  # factors no Llama 3 recipe gives
    write_gguf(tmp_path / "odd.gguf", "llama", extra={"rope_freqs.weight": odd})
    with pytest.raises(GGUFImportError, match="not from the Llama 3 recipe"):
        import_gguf(tmp_path / "odd.gguf", tmp_path / "models")
