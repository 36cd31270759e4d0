"""The worker's memory plan: weights, prompt cache and headroom out of a limit leave the KV
budget; an allocation failure is told apart from other step failures (issue 18)."""

import pytest

from mlxd.shared.errors import PayloadTooLarge
from mlxd.shared.kv_config import kv_bytes_per_token
from mlxd.worker.engine.recovery import generation_failed, is_out_of_memory
from mlxd.worker.engine.sched.memplan import plan_memory
from mlxd.worker.kv.budget import KvBudget, KvCost

GiB = 1024**3
MiB = 1024**2
LLAMA_8B = {  # Llama 3.1 8B: 32 layers, 8 KV heads of 128
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
}


def test_the_worked_example_of_the_docs():
    # docs/operations.md: an 8B bf16 model on a 64 GB Mac (48 GiB recommended working set).
    plan = plan_memory(
        machine_bytes=48 * GiB, share_bytes=None, weights_bytes=15 * GiB, prompt_cache_bytes=8 * GiB
    )
    assert plan.limit_bytes == 48 * GiB and plan.headroom_bytes == int(9.6 * GiB)
    assert plan.kv_budget_bytes == 48 * GiB - 15 * GiB - 8 * GiB - int(9.6 * GiB)
    bpt = kv_bytes_per_token(LLAMA_8B, 2)
    assert bpt == 128 * 1024
    budget = KvBudget.of(KvCost(bpt), plan.kv_budget_bytes, 32, 32768, plan.explain())
    assert budget is not None
    assert budget.admits([32768, 32768], 32768) and not budget.admits([32768] * 3, 32768)
    assert budget.admits([8192] * 14, 8192)


def test_the_supervisors_share_bounds_the_plan():
    plan = plan_memory(
        machine_bytes=100 * GiB, share_bytes=20 * GiB, weights_bytes=5 * GiB, prompt_cache_bytes=GiB
    )
    assert plan.limit_bytes == 20 * GiB and plan.kv_budget_bytes == 10 * GiB
    assert plan.total_bytes == 20 * GiB  # MLX's memory limit
    assert plan.report()["memory_limit_bytes"] == 20 * GiB


def test_a_squeezed_share_lowers_the_prompt_cache_to_leave_kv_room():
    # 10 GiB share, 6 GiB weights, 2 GiB headroom: 2 GiB left, the cache gets half of it.
    plan = plan_memory(
        machine_bytes=100 * GiB,
        share_bytes=10 * GiB,
        weights_bytes=6 * GiB,
        prompt_cache_bytes=8 * GiB,
    )
    assert plan.prompt_cache_bytes == GiB and plan.kv_budget_bytes == 10 * GiB - 8 * GiB - GiB
    assert plan.total_bytes == 10 * GiB


def test_a_share_as_small_as_the_estimate_still_leaves_kv_room():
    # The supervisor may give a worker no more than its estimate: 15 GiB of weights plus the
    # 512 MiB kv_allowance. A fifth of that as headroom would leave no KV at all (every
    # request a 413 for the worker's life); the headroom takes half of what is left instead.
    plan = plan_memory(
        machine_bytes=64 * GiB,
        share_bytes=15 * GiB + 512 * MiB,
        weights_bytes=15 * GiB,
        prompt_cache_bytes=8 * GiB,
    )
    assert plan.headroom_bytes == 256 * MiB
    assert plan.prompt_cache_bytes == 128 * MiB and plan.kv_budget_bytes == 128 * MiB


def test_a_plan_with_no_room_left_refuses_every_row_with_its_numbers():
    plan = plan_memory(
        machine_bytes=16 * GiB, share_bytes=None, weights_bytes=14 * GiB, prompt_cache_bytes=GiB
    )
    assert plan.kv_budget_bytes == 0 and plan.kv_source == "plan"
    budget = KvBudget.of(KvCost(1024), plan.kv_budget_bytes, 8, 4096, plan.explain())
    with pytest.raises(PayloadTooLarge) as exc:
        budget.check_alone(10, 5)
    msg = exc.value.message
    assert "limit 16 GiB - weights 14 GiB - prompt cache 1 GiB" in msg
    assert "10 prompt tokens + 5 reserved for output" in msg


def test_the_setting_overrides_the_plans_kv_part():
    plan = plan_memory(
        machine_bytes=16 * GiB,
        share_bytes=GiB,
        weights_bytes=2 * GiB,
        prompt_cache_bytes=0,
        kv_budget_bytes=3 * GiB,
    )
    assert plan.kv_budget_bytes == 3 * GiB and plan.explain() == "set by kv_budget_bytes"
    assert plan.total_bytes == 2 * GiB + 3 * GiB + plan.headroom_bytes  # past the share


@pytest.mark.parametrize(
    "message",
    [
        # MLX's own words, as its allocators throw them.
        "[malloc] Unable to allocate 1073741824 bytes.",
        "[metal::malloc] Attempting to allocate 8589934592 bytes which is greater than the "
        "maximum allowed buffer size of 4294967296 bytes.",
        "[metal::malloc] Resource limit (499000) exceeded.",
        "[METAL] Command buffer execution failed: Insufficient Memory "
        "(00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)",
        "[cuda] cudaMallocManaged failed: out of memory",
    ],
)
def test_an_allocation_failure_is_a_503_out_of_memory(message):
    exc = RuntimeError(message)
    assert is_out_of_memory(exc)
    err = generation_failed("r1", exc)
    assert err.status == 503 and err.code == "out_of_memory"
    assert "out of memory" in err.message and err.retry_after_s


def test_other_failures_keep_their_plain_sentence():
    assert not is_out_of_memory(ValueError("out of memory"))  # not MLX's RuntimeError
    err = generation_failed("r1", RuntimeError("eval an array without a primitive"))
    assert err.code is None and "Generation failed" in err.message


def test_the_ram_tier_on_a_cuda_card_is_an_eighth_of_the_card_not_of_the_host(tmp_path):
    # The tier's arrays live where MLX allocates: on a CUDA card, its own memory. An eighth
    # of a 126 GiB host (16 GiB) on an 80 GiB H100 ran mlx_lm.server beside it out of memory.
    import psutil

    from mlxd.shared.worker_spec import WorkerSpec
    from mlxd.worker.engine.assemble import ram_cache_bytes

    spec = WorkerSpec(model_path=tmp_path, model_id="m", socket=tmp_path / "s")
    assert ram_cache_bytes(spec, cuda_bytes=80 * GiB) == 10 * GiB
    assert ram_cache_bytes(spec, cuda_bytes=24 * GiB) == 3 * GiB
    assert ram_cache_bytes(spec, cuda_bytes=192 * GiB) == 16 * GiB  # the cap stays
    # On this CPU (no card): an eighth of RAM, as on a Mac's unified memory.
    assert ram_cache_bytes(spec) == min(psutil.virtual_memory().total // 8, 16 * GiB)
    assert ram_cache_bytes(spec.model_copy(update={"prompt_cache_bytes": 5}), 80 * GiB) == 5
