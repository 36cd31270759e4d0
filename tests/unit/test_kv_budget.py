"""KV admission: rows counted as BatchKVCache holds them (padded), a row that never fits."""

import pytest

from mlxd.shared.errors import PayloadTooLarge
from mlxd.worker.kv.budget import RESERVED_OUTPUT_TOKENS, KvBudget, kv_bytes_per_token, row_tokens

QWEN3_8B = {
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 4096,
}


def test_bytes_per_token_from_the_config():
    assert kv_bytes_per_token(QWEN3_8B, 2) == 36 * 8 * 128 * 2 * 2  # 147,456
    no_head_dim = {"num_hidden_layers": 4, "num_attention_heads": 4, "hidden_size": 256}
    assert kv_bytes_per_token(no_head_dim, 4) == 4 * 4 * 64 * 2 * 4  # MHA: KV heads = heads
    assert kv_bytes_per_token({"text_config": QWEN3_8B}, 2) == 147_456
    assert kv_bytes_per_token({"hidden_size": 8}, 2) is None


def test_rows_count_their_prompt_and_all_the_output_they_may_write():
    # Issue 18: a row is counted at its whole (clamped) max_tokens, so it never outgrows what
    # admission counted; without one, up to the context's end.
    assert row_tokens(1000, 50) == 1050
    assert row_tokens(1000, 32_000) == 33_000
    assert row_tokens(1000, 0) == 1001
    assert row_tokens(1000, None, context_limit=4096) == 4096
    assert row_tokens(1000, None) == 1000 + RESERVED_OUTPUT_TOKENS


def test_one_long_row_makes_every_row_beside_it_long():
    b = KvBudget(bytes_per_token=10, budget_bytes=10**9, max_rows=32)
    assert b.footprint([]) == 0
    assert b.footprint([1]) == 256 * 10  # BatchKVCache grows 256 positions at a time
    assert b.footprint([100, 30_000, 5]) == 3 * 30_208 * 10


def test_admission_holds_rows_and_bytes():
    b = KvBudget(bytes_per_token=1, budget_bytes=1024, max_rows=3)
    assert b.admits([200], 300)  # 2 x 512
    assert not b.admits([200, 200], 600)  # 3 x 768 > 1024
    assert not b.admits([1, 1, 1], 1)  # the row count
    assert b.admits([], 1024) and not b.admits([], 1025)


def test_a_row_that_never_fits_alone_is_refused_with_the_numbers():
    b = KvBudget(bytes_per_token=4096, budget_bytes=4096 * 700, max_rows=4)
    b.check_alone(400, 8)  # 408 -> 512 positions: fits
    with pytest.raises(PayloadTooLarge) as exc:
        b.check_alone(900, 8)
    err = exc.value
    assert err.status == 413 and err.code == "kv_budget_exceeded"
    assert "900 prompt tokens" in err.message and "4096 bytes per token" in err.message
    assert "2.7 MiB" in err.message  # the budget
    assert "(kv_budget_bytes)" in err.message  # and where it comes from
