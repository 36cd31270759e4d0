"""KV quantization without MLX: bytes per token, the fit report's rows, the SSD tensors of a
quantized entry and the fingerprint per scheme."""

from __future__ import annotations

import numpy as np
import pytest

from mlxd.shared.config import ConfigError
from mlxd.shared.config_load import load_settings
from mlxd.shared.fit import dtype_bytes_of, fit_schemes
from mlxd.shared.kv_config import KvLayer, KvLayout, kv_bytes_per_token
from mlxd.shared.kv_math import max_context, max_rows
from mlxd.shared.memory_plan import plan_memory
from mlxd.worker.cache import format as cache_format
from mlxd.worker.cache.layout import fingerprint

GiB = 1024**3
LLAMA_8B = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "torch_dtype": "bfloat16",
}


def test_bytes_per_token_float_8_and_4_bit():
    # Per vector: 128 values at the dtype, or packed at `bits` plus a bf16 scale and bias per 64.
    assert kv_bytes_per_token(LLAMA_8B, 2) == 128 * 1024
    assert kv_bytes_per_token(LLAMA_8B, 2, 8) == 32 * 8 * 2 * (128 + 8) == 68 * 1024
    assert kv_bytes_per_token(LLAMA_8B, 2, 4) == 32 * 8 * 2 * (64 + 8) == 36 * 1024
    assert kv_bytes_per_token(LLAMA_8B, 2, 4, 32) == 32 * 8 * 2 * (64 + 16)
    assert dtype_bytes_of(LLAMA_8B) == 2 and dtype_bytes_of({"torch_dtype": "float32"}) == 4


def test_what_fits_is_whole_steps_of_padded_rows():
    bpt = 128 * 1024
    assert max_context(4 * GiB, bpt) == 32768
    assert max_context(4 * GiB - 1, bpt) == 32768 - 256  # a step short
    assert max_rows(16 * GiB, bpt, 32768) == 4
    assert max_rows(16 * GiB, bpt, 32769) == 3  # padded to the next 256
    assert max_rows(0, bpt, 100) == 0


def test_fit_rows_follow_the_plan_for_each_scheme():
    plan = plan_memory(
        machine_bytes=64 * GiB,
        share_bytes=48 * GiB,
        weights_bytes=15 * GiB,
        prompt_cache_bytes=8 * GiB,
    )
    layout = KvLayout.of_config(LLAMA_8B)
    assert layout is not None
    rows = fit_schemes(layout, plan, dtype_bytes=2, context=32768)
    assert [r.kv_bits for r in rows] == [16, 8, 4]
    assert [r.max_batch_at_context for r in rows] == [3, 7, 13]  # operations.md's example
    assert [r.fits_context for r in rows] == [True, True, True]
    assert all(r.max_context_at_batch_1 == 32768 for r in rows)  # capped at the context
    # A group size that does not divide the head dim has no quantized rows.
    odd = KvLayout((KvLayer(2, 96, 96),) * 4)
    assert [
        r.kv_bits for r in fit_schemes(odd, plan, dtype_bytes=2, context=4096, group_size=64)
    ] == [16]


def test_a_quantized_entry_is_checked_against_its_bits_and_group():
    n, group = 5, 64

    def side(name, dim=128, bits=8):
        return {
            name: np.zeros((1, 2, n, dim * bits // 32), np.uint32),
            name + ".scales": np.ones((1, 2, n, dim // group), np.uint16),  # bf16 bits
            name + ".biases": np.ones((1, 2, n, dim // group), np.uint16),
        }

    arrays = {**side("0.k"), **side("0.v"), **side("1.k"), **side("1.v")}
    layout = ((2, 128, 2, 128, "uint16", 8, group),) * 2
    cache_format.check_layout(arrays, layout, n)
    with pytest.raises(cache_format.LayoutMismatch):  # the 4-bit model's layout
        cache_format.check_layout(arrays, ((2, 128, 2, 128, "uint16", 4, group),) * 2, n)
    with pytest.raises(cache_format.LayoutMismatch):  # a float model's
        cache_format.check_layout(arrays, ((2, 128, 2, 128, "uint16"),) * 2, n)


def test_the_fingerprint_covers_the_kv_scheme(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    prints = {s: fingerprint(tmp_path, s) for s in ("kv-fp", "kv-q8g64", "kv-q4g64", "kv-q4g32")}
    assert len(set(prints.values())) == 4


def test_config_takes_4_or_8_bits_and_the_group_sizes_mlx_has(tmp_path):
    toml = tmp_path / "config.toml"
    toml.write_text('[models."a"]\nkv_bits = 4\nkv_group_size = 32\n')
    ms = load_settings(config=toml).for_model("a")
    assert (ms.kv_bits, ms.kv_group_size) == (4, 32)
    assert load_settings(config=toml).for_model("b").kv_bits is None
    for bad in ("kv_bits = 3", "kv_bits = 16", "kv_group_size = 48"):
        toml.write_text(f'[models."a"]\n{bad}\n')
        with pytest.raises(ConfigError, match="kv_"):
            load_settings(config=toml)
