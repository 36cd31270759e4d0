"""Prompts through a running engine in this process, greedy, all submitted at once."""

from __future__ import annotations

import threading
from collections.abc import Callable

import mlx.core as mx
from mlx_lm.generate import generate_step

from mlxd.shared.params import GenerationParams
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.rows import Submission


def greedy_run(
    engine: Engine, prompts: dict[str, list[int]], max_tokens: int
) -> tuple[dict[str, list[int]], list[Submission]]:
    """Each prompt's generated ids by its id, and the submissions (to read what they record),
    once every row has finished."""
    got: dict[str, list[int]] = {rid: [] for rid in prompts}
    done = {rid: threading.Event() for rid in prompts}
    subs = []
    for rid, prompt in prompts.items():

        def sink(ev, rid=rid):
            got[rid] += [e["token_id"] for e in ev.logprobs or []]
            if ev.finish_reason is not None:
                done[rid].set()

        params = GenerationParams(max_tokens=max_tokens, temperature=0.0, logprobs=True)
        subs.append(Submission(rid, prompt, params, sink))
    for sub in subs:
        engine.submit(sub)
    assert all(d.wait(120) for d in done.values())
    return got, subs


def second_turns(
    engine: Engine,
    turn1: dict[str, list[int]],
    new: dict[str, list[int]],
    run: Callable[[Engine, dict[str, list[int]]], dict[str, list[int]]],
    between: Callable[[], object] = lambda: None,
) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Turn 1, then each conversation's turn 2 (its prompt, its reply, `new[rid]`), each
    through `run`, with `between()` called before turn 2; then the engine stops. Returns
    (turn 2 prompts, their ids)."""
    engine.start()
    try:
        first = run(engine, turn1)
        turn2 = {rid: p + first[rid] + new[rid] for rid, p in turn1.items()}
        between()
        second = run(engine, turn2)
    finally:
        engine.stop()
        assert engine.join(30)
    return turn2, second


def assert_greedy(model, prompts: dict[str, list[int]], got: dict[str, list[int]], n: int):
    """Each row's ids are mlx-lm's own greedy generation on the same prompt ids."""
    for rid, prompt in prompts.items():
        want = [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=n)]
        assert got[rid] == want, rid


class CountingModel:
    """The model, recording the length of each forward call."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def __call__(self, tokens, cache=None):
        self.calls.append(tokens.shape[1])
        return self.model(tokens, cache=cache)

    def __getattr__(self, name):
        return getattr(self.model, name)
