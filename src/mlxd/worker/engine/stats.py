"""What /stats reports of the engine: rows, the prefill plan, the KV budget, token rates.

Read from the event loop while the engine thread runs: every value is one counter or one
attribute read (a figure may be a step old, never torn).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import mlx.core as mx

from mlxd.shared.kv_math import KvCost
from mlxd.shared.wire.memory import ModelMemory

if TYPE_CHECKING:
    from mlxd.worker.engine.loop import Engine


def engine_stats(engine: Engine) -> dict:
    """The engine's figures, plus the prompt cache's."""
    t = engine.totals
    return {
        "rows_active": engine.active_rows,
        "rows_queued": engine.queued_rows,
        "batch_size": engine.batch_size,
        "prefill_step": engine.plan.idle_chunk,
        "prefill_budget": engine.plan.step_budget,
        "prefill_target_s": engine.plan.step_target_s,
        "prefill_pace_tps": engine.prefill_pace(),
        "kv_reserved_bytes": engine.kv_reserved(),
        "kv_bits": engine.m.kv.bits,  # None: the model's float dtype
        "kv_group_size": engine.m.kv.group_size,
        **kv_cost_report(engine.m.kv_cost),
        "kv_dtype_bytes": engine.m.kv_dtype_bytes,
        "warmup_s": None if engine.warmup_s is None else round(engine.warmup_s, 3),
        "prompt_tokens": t.prompt_tokens,
        "generation_tokens": t.generation_tokens,
        "prompt_tps": round(t.prompt_tokens / t.prompt_time, 2) if t.prompt_time else 0.0,
        "decode_tps": round(t.generation_tokens / t.decode_time, 2) if t.decode_time else 0.0,
        "requests_done": engine.requests_done,
        **first_token_report(engine),
        "cancellations": engine.cancellations,
        "engine_recoveries": engine.recoveries,
        "preemptions": engine.preemptions,
        "memory_active_bytes": mx.get_active_memory(),
        "memory_peak_bytes": mx.get_peak_memory(),
        **(engine.cache.stats() if engine.cache else {}),
        **spec_report(engine),
        **memory_report(engine),
    }


def first_token_report(engine: Engine) -> dict:
    """Rows that got a first token, and the seconds they spent queued and then admitted
    before it (sums: a scrape's difference over its count gives the mean)."""
    ft = engine.first_tokens
    return {
        "first_tokens": ft.count,
        "queue_wait_s": round(ft.queue_s, 6),
        "admitted_to_first_token_s": round(ft.prefill_s, 6),
    }


def model_memory(engine: Engine) -> ModelMemory:
    """What the worker holds now, as the supervisor's budget counts it (the one definition,
    shared/wire/memory.py): the weights, the RAM prompt cache's bytes, and the KV the rows in
    flight are counted at and that their tokens so far fill."""
    plan = engine.memory_plan
    rows = engine.rows_in_flight()
    # Positions in the cache now (a resumed row's pos runs over its tokens too: capped).
    filled = [min(r.pos, len(r.sub.prompt)) + r.generated for r in rows]
    cost = engine.m.kv_cost or KvCost(0)
    return ModelMemory(
        weights_bytes=plan.weights_bytes if plan else engine.m.weights_bytes,
        prompt_cache_bytes=engine.cache.ram.nbytes if engine.cache else 0,
        kv_reserved_bytes=engine.kv_reserved(),
        kv_in_use_bytes=cost.footprint(len(rows), max(filled, default=0)),
    )


def kv_cost_report(cost: KvCost | None) -> dict:
    """What a row's caches hold (measured at load: worker/kv/cost.py), as /stats names it."""
    if cost is None:
        return {"kv_bytes_per_token": None}
    return cost.report()


def memory_report(engine: Engine) -> dict:
    """The memory figures /stats carries: the model's memory, its parts, the plan's limit."""
    plan = engine.memory_plan
    budget = engine.kv_budget
    mem = model_memory(engine)
    return {
        "weights_bytes": mem.weights_bytes,
        "kv_budget_bytes": budget.budget_bytes if budget else None,
        "kv_in_use_bytes": mem.kv_in_use_bytes,
        "memory_limit_bytes": plan.total_bytes if plan else None,
        "memory_in_use_bytes": mem.total_bytes,
    }


def spec_report(engine: Engine) -> dict:
    """Speculative decoding's counters: verify steps, tokens drafted and accepted."""
    spec = engine.spec
    if spec is None:
        return {"speculative": "off"}
    st = spec.stats
    rate = round(st.accepted / st.drafted, 4) if st.drafted else 0.0
    return {
        "speculative": spec.mode,
        "spec_steps": st.steps,
        "spec_drafted_tokens": st.drafted,
        "spec_accepted_tokens": st.accepted,
        "spec_acceptance_rate": rate,
    }
