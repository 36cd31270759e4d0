"""What the benchmark reads from the supervisor's /metrics: the SSD tier's bytes written, and
the engine's part of each first token."""

from __future__ import annotations

from .client import Target

SSD_WRITTEN = "mlxd_prompt_cache_ssd_written_bytes_total"
# The engine's part of each first token: the sums of its two summaries, then their count.
ENGINE_FIRST = (
    "mlxd_engine_queue_wait_seconds_sum",
    "mlxd_engine_admitted_to_first_token_seconds_sum",
    "mlxd_engine_queue_wait_seconds_count",
)


async def metric_sums(
    target: Target, *names: str, model: str | None = None
) -> dict[str, float] | None:
    """Each named series of the supervisor's /metrics, summed over its labels, or only
    `model`'s (None: no /metrics, or a name it does not report)."""
    async with target.session() as session:
        async with session.get("/metrics") as resp:
            if resp.status != 200:
                return None
            text = await resp.text()
    sums: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names and (model is None or f'model="{model}"' in line):
            sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return sums if len(sums) == len(names) else None


async def ssd_written_bytes(target: Target) -> float | None:
    """What the supervisor's workers wrote to their SSD tier so far (None: not reported)."""
    sums = await metric_sums(target, SSD_WRITTEN)
    return sums[SSD_WRITTEN] if sums else None


async def engine_first(target: Target) -> dict[str, float] | None:
    """The engine's first-token sums and count for the target's model, so far."""
    return await metric_sums(target, *ENGINE_FIRST, model=target.model)


def engine_first_means(before: dict, after: dict) -> tuple[float, float] | None:
    """Mean seconds queued, then admitted before the first token, per request between two
    readings (None: no request, or a worker restart between them reset its sums)."""
    delta = {k: after[k] - before[k] for k in ENGINE_FIRST}
    count = delta[ENGINE_FIRST[2]]
    if count <= 0 or min(delta.values()) < 0:
        return None
    return delta[ENGINE_FIRST[0]] / count, delta[ENGINE_FIRST[1]] / count
