"""KV reserved as rows grow, the newest rows preempted when a block is short (issue 33).

A KV budget far below what the rows would need at their whole max_tokens: they are admitted
on their prompt plus one block, and as they grow past it the newest are preempted, parked in
the RAM prompt cache (or dropped, without one) and resumed where they stopped. The oracle is
mlx-lm's own greedy generation on each row's ids: whatever the engine did, every row's tokens
are those, each sent once.
"""

from __future__ import annotations

import random
import threading
from dataclasses import replace

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_logits_processors

from mlxd.shared.errors import Unavailable
from mlxd.shared.params import GenerationParams
from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.chat.think_budget import ThinkBudget
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.rows import Submission
from mlxd.worker.engine.sched.planner import PlanConfig
from mlxd.worker.kv.reserve import BLOCK
from mlxd.worker.model.load import load_model

PROMPT, OUTPUT, ROWS = 200, 330, 4


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(tiny_model_dir, "tiny")


class Row:
    """A greedy submission that never stops early (end-of-sequence biased away), recorded."""

    def __init__(self, rid: str, eos_ids):
        rng = random.Random(rid)
        self.prompt = [rng.randrange(10, 2000) for _ in range(PROMPT)]
        self.bias = dict.fromkeys(eos_ids, -100.0)
        self.events: list = []
        self.done = threading.Event()
        params = GenerationParams(
            max_tokens=OUTPUT,
            temperature=0.0,
            top_p=1.0,
            top_k=0,
            logprobs=True,
            logit_bias=self.bias,
        )
        self.sub = Submission(rid, list(self.prompt), params, self._sink)

    def _sink(self, ev) -> None:
        self.events.append(ev)
        if ev.finish_reason is not None:
            self.done.set()

    @property
    def tokens(self) -> list[int]:
        return [lp["token_id"] for ev in self.events for lp in ev.logprobs or []]


ORACLE: dict[str, list[int]] = {}  # by rid: every test's rows have the same prompts


def mlx_lm_greedy(model, row: Row) -> list[int]:
    rid = row.sub.rid
    if rid not in ORACLE:
        procs = make_logits_processors(logit_bias=row.bias)
        out = generate_step(mx.array(row.prompt), model, max_tokens=OUTPUT, logits_processors=procs)
        ORACLE[rid] = [int(t) for t, _ in out]
    return ORACLE[rid]


# Recomputed (no cache to park in) is the long tier's: a row resumed by re-prefilling its
# prompt and tokens is held in the fast tier by test_worker_hardening's out-of-memory waits.
@pytest.mark.parametrize(
    "cached",
    [True, pytest.param(False, marks=pytest.mark.slow)],
    ids=["parked-in-ram-cache", "recomputed"],
)
def test_rows_preempted_for_kv_finish_with_mlx_lms_greedy_tokens(loaded, cached):
    bpt = loaded.kv_bytes_per_token
    # Counted at prompt + max_tokens (530 -> 768 positions each) two rows would fit; by the
    # block three start (prompt + 256 = 456 -> 512 positions each), and as the oldest grows
    # past 512 positions the newest must make room.
    budget = bpt * 3 * 512
    steps: list = []
    cache = PromptCache(1 << 30, None, 0) if cached else None
    plan = PlanConfig(idle_chunk=64, step_budget=64, min_chunk=16)
    engine = Engine(
        loaded, batch=8, plan=plan, kv_budget_bytes=budget, cache=cache, trace=steps.append
    )
    rows = [Row(f"r{i}", loaded.eos_ids) for i in range(ROWS)]
    for row in rows:
        engine.submit(row.sub)
    engine.start()
    for row in rows:
        assert row.done.wait(300), row.sub.rid
    stats = engine.stats()
    engine.stop()
    assert engine.join(30)

    assert steps[0].admitted == ["r0", "r1", "r2"] and steps[0].queued == 1  # prompt + block
    assert stats["preemptions"] > 0
    assert stats["preemptions"] == sum(len(st.preempted) for st in steps)
    assert "r0" not in {rid for st in steps for rid in st.preempted}  # the oldest runs on
    assert stats["rows_queued"] == 0 and stats["rows_active"] == 0
    for row in rows:
        assert row.events[-1].error is None and row.events[-1].finish_reason == "length"
        assert row.events[-1].completion_tokens == OUTPUT
        assert row.tokens == mlx_lm_greedy(loaded.model, row), row.sub.rid  # each sent once
        text = "".join(ev.text for ev in row.events)  # the text stream went on where it was
        assert text == loaded.tokenizer.decode(row.tokens), row.sub.rid

    if cached:  # a resumed row starts from its parked KV: nothing of it is prefilled again
        preempted = {rid for st in steps for rid in st.preempted}
        first = {rid: min(s.step for s in steps if rid in s.preempted) for rid in preempted}
        again = [
            (st.step, rid, st.chunks[rid])
            for st in steps
            for rid in first
            if st.step > first[rid] and rid in st.chunks
        ]
        assert not again, again
    assert BLOCK == 256  # the numbers above assume mlx-lm's growth step


def test_a_row_cancelled_while_preempted_hears_it_once_and_the_others_finish(loaded):
    """Two rows, room for both at prompt + one block only: the newer is preempted when the
    older grows past it, and its client leaves while it waits. It hears its cancellation with
    the tokens it was sent; a row that cannot be resumed (a processor that does not follow
    its context by position) is never preempted: counted whole from admission, it waits for
    room instead."""
    old, new, fixed = (Row(rid, loaded.eos_ids) for rid in ("r0", "r1", "r2"))
    fixed.sub.processors = [lambda tokens, logits: logits]  # not marked resumable
    gone = Unavailable("the client left")
    steps: list = []

    def on_step(st):  # on the engine thread: the cancel is in its inbox before the next step
        steps.append(st)
        if "r1" in st.preempted:
            engine.cancel(new.sub, gone)

    bpt = loaded.kv_bytes_per_token
    cache = PromptCache(1 << 30, None, 0)
    engine = Engine(loaded, batch=8, kv_budget_bytes=bpt * 2 * 512, cache=cache, trace=on_step)
    for row in (old, new, fixed):
        engine.submit(row.sub)
    engine.start()
    for row in (old, new, fixed):
        assert row.done.wait(300), row.sub.rid
    stats = engine.stats()
    engine.stop()
    assert engine.join(30)

    assert steps[0].admitted == ["r0", "r1"]  # r2 is counted at 768 positions: it waits
    assert [rid for st in steps for rid in st.preempted] == ["r1"]
    last = new.events[-1]
    assert last.error is gone and last.completion_tokens == len(new.tokens) > 0
    assert new.tokens == mlx_lm_greedy(loaded.model, new)[: len(new.tokens)]
    for row in (old, fixed):
        assert row.events[-1].finish_reason == "length"
        assert row.tokens == mlx_lm_greedy(loaded.model, row), row.sub.rid
    assert stats["preemptions"] == 1 and stats["cancellations"] == 1
    assert stats["rows_queued"] == 0 and stats["rows_active"] == 0


def test_a_seeded_row_with_a_thinking_budget_resumes_with_the_text_it_gives_alone(loaded):
    """A sampled row (seed, temperature 1) with a thinking budget that binds after the
    preemption: its key and its budget's count go on where they stopped, so its tokens are
    those it gives running alone, the end marker forced at the same place."""
    end = (5, 6)  # the budget forces these after 300 reasoning tokens

    def sampled(rid: str) -> Row:
        row = Row(rid, loaded.eos_ids)
        row.sub.params = replace(row.sub.params, temperature=1.0, seed=7)
        row.sub.processors = [ThinkBudget(300, (), end, in_reasoning=True)]
        return row

    def run(rows: list[Row], **kw) -> list:
        steps: list = []
        engine = Engine(
            loaded, batch=8, cache=PromptCache(1 << 30, None, 0), trace=steps.append, **kw
        )
        for row in rows:
            engine.submit(row.sub)
        engine.start()
        for row in rows:
            assert row.done.wait(300), row.sub.rid
        engine.stop()
        assert engine.join(30)
        return steps

    alone = sampled("r1")
    run([alone])
    old, row = Row("r0", loaded.eos_ids), sampled("r1")
    steps = run([old, row], kv_budget_bytes=loaded.kv_bytes_per_token * 2 * 512)

    assert [rid for st in steps for rid in st.preempted] == ["r1"]
    assert len(row.tokens) == OUTPUT and row.events[-1].finish_reason == "length"
    assert row.tokens == alone.tokens
    assert row.tokens[300:302] == list(end)  # the budget counted what came before, once
    assert old.tokens == mlx_lm_greedy(loaded.model, old)
