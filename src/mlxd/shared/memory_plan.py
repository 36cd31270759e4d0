"""A worker's memory plan: what its KV budget and MLX's memory limit are, and why.

Pure (no MLX): the worker's app.py measures the parts and applies the result; the fit report
(shared/fit.py) runs the same plan from what the supervisor knows. A worker may use
`limit_bytes`: the machine's memory for MLX (Metal's recommended working set, CUDA's device
memory, else RAM), or less when the supervisor's budget gives this worker a smaller share
(WorkerSpec.memory_limit_bytes: its budget less what the other workers report). Out of that
come the weights, the RAM prompt-cache cap and a headroom (activations of a prefill chunk,
MLX's buffer cache, the system); the rest is the KV budget the rows in flight share
(kvbudget.py). A budget that holds no row at all is kept as it is: every request is then a
413 naming these numbers, which says more than a worker that runs out of memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxd.shared.sizes import format_size

# Of the limit, this fraction is left for activations, MLX's buffer cache (1/16 of the
# device, model.py) and whatever else runs beside the worker.
HEADROOM_FRACTION = 0.2
GiB = 1024**3


@dataclass(frozen=True)
class MemoryPlan:
    """The parts of one worker's memory, in bytes, and the KV budget they leave."""

    limit_bytes: int  # what this worker may use (the machine's or the supervisor's share)
    machine_bytes: int  # the machine's memory for MLX
    weights_bytes: int
    prompt_cache_bytes: int  # the RAM prompt-cache cap
    headroom_bytes: int
    kv_budget_bytes: int  # what the rows in flight may hold
    kv_source: str  # "plan" (the rest of the limit) or "kv_budget_bytes" (the setting)

    @property
    def total_bytes(self) -> int:
        """MLX's memory limit: the worker's limit, or what the parts add up to when a set
        kv_budget_bytes takes them past it."""
        parts = self.weights_bytes + self.prompt_cache_bytes + self.headroom_bytes
        return max(self.limit_bytes, parts + self.kv_budget_bytes)

    def explain(self) -> str:
        """The numbers behind the KV budget, in words a 413 can carry."""
        if self.kv_source != "plan":
            return "set by kv_budget_bytes"
        return (
            f"memory plan: limit {format_size(self.limit_bytes)} - weights"
            f" {format_size(self.weights_bytes)} - prompt cache"
            f" {format_size(self.prompt_cache_bytes)} - headroom {format_size(self.headroom_bytes)}"
        )

    def report(self) -> dict:
        """What /stats and /health report of the plan (the supervisor's budget reads it)."""
        return {
            "memory_limit_bytes": self.limit_bytes,
            "machine_memory_bytes": self.machine_bytes,
            "weights_bytes": self.weights_bytes,
            "prompt_cache_cap_bytes": self.prompt_cache_bytes,
            "headroom_bytes": self.headroom_bytes,
            "kv_budget_bytes": self.kv_budget_bytes,
        }


def plan_memory(
    *,
    machine_bytes: int,
    share_bytes: int | None,
    weights_bytes: int,
    prompt_cache_bytes: int,
    kv_budget_bytes: int | None = None,
) -> MemoryPlan:
    """The plan for a worker on a machine with `machine_bytes` for MLX.

    `share_bytes` (None: the whole machine) is the supervisor's share for this worker (the
    prompt cache then gets at most half of what the weights and headroom leave);
    `kv_budget_bytes` set overrides the KV part (0: no KV bound, rows bounded by `batch`).
    """
    limit = machine_bytes if share_bytes is None else min(machine_bytes, share_bytes)
    headroom = int(limit * HEADROOM_FRACTION)
    if share_bytes is not None:
        # A share squeezed by other workers must still leave KV room: the headroom takes at
        # most half of what the weights leave (a share can be as small as the supervisor's
        # estimate, weights plus kv_allowance_bytes), and the prompt cache at most half of what
        # the weights and headroom leave (the worker lowers its cap).
        headroom = min(headroom, max(0, limit - weights_bytes) // 2)
        room = max(0, limit - weights_bytes - headroom)
        prompt_cache_bytes = min(prompt_cache_bytes, room // 2)
    if kv_budget_bytes is not None:
        kv, source = kv_budget_bytes, "kv_budget_bytes"
    else:
        kv, source = max(0, limit - weights_bytes - prompt_cache_bytes - headroom), "plan"
    return MemoryPlan(
        limit_bytes=limit,
        machine_bytes=machine_bytes,
        weights_bytes=weights_bytes,
        prompt_cache_bytes=prompt_cache_bytes,
        headroom_bytes=headroom,
        kv_budget_bytes=kv,
        kv_source=source,
    )
