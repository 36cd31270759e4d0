"""A model's memory: the one definition every view shows (mlxctl ps, show and fit, /admin/models,
/admin/memory, /admin/fit, the dashboard, Ollama's /api/ps).

The worker reports its parts in /health (worker/engine/stats.py); the supervisor keeps the
latest report on the model's slot and every view reads it from there, so they agree. Before a
worker has reported (starting), the figures are the supervisor's estimate (`reported` false).
"""

from __future__ import annotations

from pydantic import BaseModel, computed_field


class ModelMemory(BaseModel):
    """What one model holds, in bytes; `total_bytes` is what the memory budget counts."""

    weights_bytes: int = 0  # weight files as loaded (a draft model's included)
    prompt_cache_bytes: int = 0  # the RAM prompt cache's entries
    kv_reserved_bytes: int = 0  # KV the rows in flight are counted at (their whole length)
    kv_in_use_bytes: int = 0  # KV their tokens so far fill (at most the reserved)
    reported: bool = True  # the worker's own report; false: the estimate before it reports

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total_bytes(self) -> int:
        """Weights + prompt cache + KV reserved: what admission and eviction count."""
        return self.weights_bytes + self.prompt_cache_bytes + self.kv_reserved_bytes

    @classmethod
    def estimate(cls, estimate_bytes: int, kv_allowance_bytes: int) -> ModelMemory:
        """Before a worker reports: its weights and the configured KV allowance."""
        kv = min(kv_allowance_bytes, estimate_bytes)
        return cls(weights_bytes=estimate_bytes - kv, kv_reserved_bytes=kv, reported=False)

    def times(self, ranks: int) -> ModelMemory:
        """A worker group's memory on this host: each local rank holds about rank 0's weights
        and KV; the prompt cache is rank 0's alone."""
        if ranks == 1:
            return self
        return ModelMemory(
            weights_bytes=self.weights_bytes * ranks,
            prompt_cache_bytes=self.prompt_cache_bytes,
            kv_reserved_bytes=self.kv_reserved_bytes * ranks,
            kv_in_use_bytes=self.kv_in_use_bytes * ranks,
            reported=self.reported,
        )
