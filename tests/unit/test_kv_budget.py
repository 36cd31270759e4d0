"""KV admission: rows counted as BatchKVCache holds them (padded), a row that never fits."""

import pytest

from mlxd.shared.errors import PayloadTooLarge
from mlxd.shared.kv_config import kv_bytes_per_token
from mlxd.shared.params import GenerationParams
from mlxd.worker.engine.rows import Submission
from mlxd.worker.engine.sched.preempt import resumable
from mlxd.worker.kv.budget import RESERVED_OUTPUT_TOKENS, KvBudget, KvCost, row_tokens
from mlxd.worker.kv.reserve import (
    BLOCK,
    Held,
    first_reservation,
    next_reservation,
    plan_growth,
)

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
    b = KvBudget(KvCost(10), budget_bytes=10**9, max_rows=32)
    assert b.footprint([]) == 0
    assert b.footprint([1]) == 256 * 10  # BatchKVCache grows 256 positions at a time
    assert b.footprint([100, 30_000, 5]) == 3 * 30_208 * 10


def test_admission_holds_rows_and_bytes():
    b = KvBudget(KvCost(1), budget_bytes=1024, max_rows=3)
    assert b.admits([200], 300)  # 2 x 512
    assert not b.admits([200, 200], 600)  # 3 x 768 > 1024
    assert not b.admits([1, 1, 1], 1)  # the row count
    assert b.admits([], 1024) and not b.admits([], 1025)


def test_a_row_that_never_fits_alone_is_refused_with_the_numbers():
    b = KvBudget(KvCost(4096), budget_bytes=4096 * 700, max_rows=4)
    b.check_alone(400, 8)  # 408 -> 512 positions: fits
    with pytest.raises(PayloadTooLarge) as exc:
        b.check_alone(900, 8)
    err = exc.value
    assert err.status == 413 and err.code == "kv_budget_exceeded"
    assert "900 prompt tokens" in err.message and "4096 bytes per token" in err.message
    assert "2.7 MiB" in err.message  # the budget
    assert "(kv_budget_bytes)" in err.message  # and where it comes from


# -- issue 33: reserved by the block as a row grows, the newest rows preempted -----------------


def test_a_row_is_admitted_on_its_prompt_and_one_block_of_output():
    # Claude Code's max_tokens 32000 on a 1000-token prompt: counted at 1256, not 33,000.
    assert first_reservation(full=33_000, held=1000) == 1000 + BLOCK
    assert first_reservation(full=1050, held=1000) == 1050  # never beyond its whole length
    # Resumed after a preemption: what it wrote so far is held too.
    assert first_reservation(full=33_000, held=1000 + 300) == 1300 + BLOCK


def test_a_row_takes_its_next_block_when_it_crosses_its_reservation():
    assert next_reservation(reserved=1256, filled=1255, full=33_000) == 1256  # room for one
    assert next_reservation(reserved=1256, filled=1256, full=33_000) == 1256 + BLOCK
    assert next_reservation(reserved=33_000, filled=33_000, full=33_000) == 33_000
    assert next_reservation(reserved=32_900, filled=32_900, full=33_000) == 33_000


def held(key, order, reserved, filled, full=10_000, resumable=True):
    return Held(key, order, reserved, filled, full, resumable)


def test_rows_grow_without_preemption_while_the_budget_holds_them():
    b = KvBudget(KvCost(1), budget_bytes=3 * 768, max_rows=8)
    rows = [held("a", 0, 512, 512), held("b", 1, 512, 300), held("c", 2, 256, 100)]
    g = plan_growth(rows, b)
    assert g.reserved == {"a": 768, "b": 512, "c": 256} and not g.preempt and not g.over


def test_the_newest_rows_are_preempted_when_a_block_is_short():
    # Three rows at 512 fill the budget; "a" crossing its reservation needs 768 for all.
    b = KvBudget(KvCost(1), budget_bytes=3 * 512, max_rows=8)
    rows = [held("c", 2, 512, 200), held("a", 0, 512, 512), held("b", 1, 512, 400)]
    g = plan_growth(rows, b)
    assert g.preempt == ["c"]  # the newest by admission order, not the last listed
    assert g.reserved == {"a": 768, "b": 512}
    # Tighter: both newer rows go, newest first; the oldest keeps running.
    b = KvBudget(KvCost(1), budget_bytes=2 * 512, max_rows=8)
    g = plan_growth(rows, b)
    assert g.preempt == ["c", "b"] and g.reserved == {"a": 768}


def test_a_newer_row_that_needs_a_block_preempts_itself_first():
    b = KvBudget(KvCost(1), budget_bytes=2 * 512, max_rows=8)
    g = plan_growth([held("old", 0, 512, 100), held("new", 1, 512, 512)], b)
    assert g.preempt == ["new"] and g.reserved == {"old": 512}


def test_the_oldest_a_lone_row_and_rows_that_cannot_resume_are_never_preempted():
    b = KvBudget(KvCost(1), budget_bytes=512, max_rows=8)
    g = plan_growth([held("lone", 0, 512, 512)], b)
    assert not g.preempt and g.over == ["lone"] and g.reserved == {"lone": 768}
    b = KvBudget(KvCost(1), budget_bytes=2 * 512, max_rows=8)
    rows = [held("old", 0, 512, 512), held("grammar", 1, 512, 10, resumable=False)]
    g = plan_growth(rows, b)
    assert not g.preempt and g.over == ["old"]
    rows.append(held("newest", 2, 512, 10))
    g = plan_growth(rows, b)  # the resumable one goes; still short: "old" grows over
    assert g.preempt == ["newest"] and g.over == ["old"]


def test_rows_whose_processors_cannot_be_resumed_are_not_preempted():
    def sub(*processors, **params):
        p = GenerationParams(max_tokens=8, **params)
        return Submission("r", [1, 2], p, print, processors=list(processors))

    class Positional:  # follows the context by position, as a grammar and a budget do
        resumable = True

    assert resumable(sub(temperature=0.0)) and resumable(sub(temperature=0.7, seed=3))
    assert resumable(sub(Positional()))
    assert not resumable(sub(Positional(), lambda tokens, logits: logits))
