"""A row's first token sampled from its prefill forward (model/head.py, mlx_lm_seam.folding):
one forward fewer per newcomer, and the same tokens as mlx-lm's own order (its last prompt
token alone through a decode forward) and as mlx-lm's generate on the same ids."""

from __future__ import annotations

import json
import random

import mlx.core as mx
import pytest
from engine_runs import CountingModel, assert_greedy, greedy_run
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model as mlx_load

from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.sched.planner import PlanConfig
from mlxd.worker.engine.step.generator import decode_batch, make_generator, step
from mlxd.worker.model import head
from mlxd.worker.model import mlx_lm_seam as seam
from mlxd.worker.model.load import load_model

from tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(tiny_model_dir, "tiny")


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    """The tiny qwen3 with its own lm_head (the tiny llama ties it to the embedding)."""
    d = build_tiny_model(tmp_path_factory.mktemp("untied") / "m", arch="qwen3", seed=5)
    cfg = d / "config.json"
    config = json.loads(cfg.read_text())
    config["tie_word_embeddings"] = False
    cfg.write_text(json.dumps(config))
    model, _ = mlx_load(d, strict=False)  # lm_head's weights are drawn: it is not in the file
    return model


def test_the_gathered_head_gives_the_full_forwards_logits_at_each_rows_position(loaded, untied):
    for model, where in ((loaded.model, "embed_tokens"), (untied, "lm_head")):
        site = head.probe(model)
        assert site is not None and site.name == where
        ids = mx.array([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
        full = model(ids, cache=make_prompt_cache(model))
        with head.gathered(site, mx.array([5, 2])):
            part = model(ids, cache=make_prompt_cache(model))
        assert part.shape == (2, 1, full.shape[-1])
        assert mx.allclose(part[0, 0], full[0, 5], atol=1e-4).item()
        assert mx.allclose(part[1, 0], full[1, 2], atol=1e-4).item()
        # ...and the head is put back: a plain forward gives every position again
        assert model(ids, cache=make_prompt_cache(model)).shape == full.shape


def test_a_model_whose_head_is_elsewhere_keeps_mlx_lms_order(loaded):
    class Headless:  # a module tree with no lm_head and no embed_tokens
        def named_modules(self):
            return [("", self), ("model.wte", object())]

    assert head.find_site(Headless()) is None
    assert head.probe(Headless()) is None


def _first_tokens(loaded, fold: bool, prompts: list[list[int]]):
    """Each row's first 4 tokens and the forwards run, through a generator stepped as the
    engine steps it."""
    model = CountingModel(loaded.model)
    site = head.probe(loaded.model) if fold else None
    gen = make_generator(model, batch=4, chunk=64, stream=mx.default_stream(mx.default_device()))
    uids = gen.insert_segments([[p] for p in prompts], max_tokens=[4] * len(prompts))
    if fold:
        for uid in uids:
            seam.fold_last_token(gen, uid)
    got: dict[int, list[int]] = {u: [] for u in uids}
    for _ in range(12):
        _, responses = step(gen, True, site)
        for r in responses:
            got[r.uid].append(r.token)
        if all(len(t) == 4 for t in got.values()):
            break
    assert len(decode_batch(gen)) == 0
    return [got[u] for u in uids], model.calls


def test_a_newcomers_first_token_comes_from_its_prefill_forward(loaded):
    prompts = [list(range(5, 12)), list(range(40, 51))]  # 7 and 11 tokens, one forward
    folded, calls = _first_tokens(loaded, True, prompts)
    plain, plain_calls = _first_tokens(loaded, False, prompts)
    assert folded == plain
    # mlx-lm's order: both prompts but their last token (10 wide), then that token alone
    # before the first decode; folded: the whole prompts in one forward, then decode only.
    assert plain_calls[:2] == [10, 1] and calls[0] == 11
    assert len(calls) == len(plain_calls) - 1
    assert all(n == 1 for n in calls[1:])


@pytest.mark.parametrize("fold", [True, False], ids=["first-token-from-prefill", "mlx-lm-order"])
def test_a_batch_with_cached_prefixes_writes_mlx_lms_greedy_tokens(loaded, fold):
    """Rows of many lengths, some on a prefix another row left in the prompt cache, some
    longer than a prefill chunk: each writes mlx-lm's own greedy tokens either way."""
    rng = random.Random(3)
    shared = [rng.randrange(10, 2000) for _ in range(90)]
    prompts = {
        "a": shared + [rng.randrange(10, 2000) for _ in range(7)],
        "b": shared + [rng.randrange(10, 2000) for _ in range(40)],
        "c": [rng.randrange(10, 2000) for _ in range(150)],  # past one 64-token chunk
        "d": [rng.randrange(10, 2000) for _ in range(2)],
    }
    plan = PlanConfig(idle_chunk=64, step_budget=64, min_chunk=8)
    cache = PromptCache(1 << 26, None, 0, earn_tokens=1)
    engine = Engine(
        loaded, batch=4, plan=plan, cache=cache, warmup=False, first_token_from_prefill=fold
    )
    assert (engine._batch.head is not None) == fold
    engine.start()
    try:
        got, _ = greedy_run(engine, {"s": shared}, 3)  # leaves the shared prefix cached
        got, subs = greedy_run(engine, prompts, 6)
    finally:
        engine.stop()
        assert engine.join(30)
    assert {s.rid for s in subs if s.prompt_cached > 0} == {"a", "b"}
    assert_greedy(loaded.model, prompts, got, 6)
