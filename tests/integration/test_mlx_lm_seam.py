"""The mlx-lm seam pinned on the installed mlx-lm: every private attribute mlxd names exists
with the type it expects, our decode batch really is the one mlx-lm decodes through, the
prefill chunk we plan is the one mlx-lm prefills, and a renamed attribute fails loudly."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from engine_runs import CountingModel
from mlx_lm.generate import GenerationBatch, PromptProcessingBatch
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxd.worker.engine.step.decode import DecodeBatch
from mlxd.worker.engine.step.generator import decode_batch, make_generator
from mlxd.worker.model import mlx_lm_seam as seam
from mlxd.worker.model.load import load_model


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(tiny_model_dir, "tiny")


def _gen(loaded, chunk: int = 32):
    stream = mx.default_stream(mx.default_device())
    return make_generator(loaded.model, batch=4, chunk=chunk, stream=stream)


def _instances(loaded) -> dict[type, object]:
    """A live instance of each class the seam names, made as mlx-lm makes them."""
    plain = seam.BatchGenerator(loaded.model, stream=mx.default_stream(mx.default_device()))
    return {
        seam.BatchGenerator: plain,
        PromptProcessingBatch: plain._prompt_batch,
        GenerationBatch: plain._generation_batch,
        BatchKVCache: BatchKVCache([0, 2]),
        TokenizerWrapper: loaded.tokenizer,
    }


EXPECTED_TYPES = {
    "_generation_batch": GenerationBatch,
    "_prompt_batch": PromptProcessingBatch,
    "prefill_step_size": int,
    "_token_context": list,
    "_num_tokens": list,
    "_matchers": list,
    "_next_logprobs": list,
    "_idx": int,
}


def test_every_private_name_the_seam_uses_exists_with_its_type(loaded):
    made = _instances(loaded)
    for cls, name in seam.SEAM:
        obj = made[cls]
        assert isinstance(obj, cls)
        assert hasattr(obj, name), f"mlx-lm's {cls.__name__} lost {name!r}"
        if name in EXPECTED_TYPES:
            assert isinstance(getattr(obj, name), EXPECTED_TYPES[name]), (cls, name)
    assert isinstance(made[GenerationBatch]._next_tokens, mx.array)  # empty: nothing sampled yet
    assert hasattr(made[TokenizerWrapper]._tokenizer, "chat_template")


def test_mlx_lm_decodes_through_our_batch_and_prefills_in_our_chunks(loaded):
    model = CountingModel(loaded.model)
    stream = mx.default_stream(mx.default_device())
    gen = make_generator(model, batch=4, chunk=4, stream=stream)
    ours = decode_batch(gen)
    assert isinstance(ours, DecodeBatch)
    (uid,) = gen.insert([list(range(5, 30))], max_tokens=[3])
    tokens = []
    for step in range(20):
        if step == 1:  # the plan changes while the row is in mlx-lm's prompt batch
            seam.set_prefill_chunk(gen, 8)
        tokens += [r.token for r in gen.next()[1] if r.uid == uid]
        if len(tokens) == 3:
            break
    # 4 prompt tokens in the first step, then 8 a step in one forward each, as re-planned
    # (mlx-lm keeps its own copy of the forward size in the prompt batch: setting only the
    # generator's would run each 8-token chunk as two forwards of 4)
    assert [n for n in model.calls if n > 1][:3] == [4, 8, 8]
    assert len(tokens) == 3
    assert ours.uids == [] and ours.num_tokens == []  # the row decoded in ours, and left it


def test_the_handed_over_rows_carry_their_first_token(loaded):
    gen = _gen(loaded)
    gen.insert([list(range(5, 12))], max_tokens=[4])
    while not len(decode_batch(gen)):
        gen.next()
    batch = decode_batch(gen)
    assert batch.num_tokens == [0] and batch.pending[0] is not None
    assert batch.pending[0].shape == (1,)


def test_a_renamed_attribute_fails_loudly_instead_of_being_created(loaded):
    gen = _gen(loaded)
    del gen._prompt_batch  # what an mlx-lm that renamed it would look like to us
    with pytest.raises(seam.SeamError, match="_prompt_batch"):
        seam.set_prefill_chunk(gen, 8)
    assert not hasattr(gen, "_prompt_batch")

    class Renamed:  # a GenerationBatch whose private names moved
        _token_context: list = []

    with pytest.raises(seam.SeamError, match="_num_tokens"):
        seam.handed_rows(Renamed())
    cache = BatchKVCache([0])
    del cache._idx
    with pytest.raises(seam.SeamError, match="_idx"):
        seam.advance_write_index(cache)


def test_rows_leaving_prefill_together_keep_their_kv_without_a_copy(loaded):
    """All rows leave: the same cache objects move (no deep copy); some rows leave: mlx-lm's
    own split, each half with its own rows. Either way the rows' keys are unchanged."""
    from mlx_lm.models.cache import make_prompt_cache

    seam.patch_prompt_split()
    caches = []
    for n in (7, 11):
        c = make_prompt_cache(loaded.model)
        loaded.model(mx.array([list(range(3, 3 + n))]), cache=c)
        caches.append(c)

    def made(caches):  # as BatchGenerator makes one: every per-row list filled
        return PromptProcessingBatch(
            loaded.model, [0, 1], caches, samplers=[None, None], logits_processors=[[], []]
        )

    batch = made(caches)
    before = [batch.prompt_cache[0].extract(i).keys for i in (0, 1)]
    whole = batch.prompt_cache
    moved = batch.split([1, 0])
    assert moved.prompt_cache is whole and moved.uids == [0, 1]
    assert batch.uids == [] and batch.prompt_cache == [] and len(batch) == 0
    after = [moved.prompt_cache[0].extract(i).keys for i in (0, 1)]
    assert all(mx.array_equal(a, b).item() for a, b in zip(before, after, strict=True))

    again = made(caches)
    part = again.split([1])
    assert part.uids == [1] and again.uids == [0]
    assert part.prompt_cache is not again.prompt_cache
    assert mx.array_equal(part.prompt_cache[0].extract(0).keys, before[1]).item()


def test_row_hooks_hear_each_prefill_chunks_place_in_the_prompt(loaded):
    """The vision hook places a row's image features by where its chunk starts in its prompt:
    `PromptProcessingBatch.tokens` must hold each row's tokens already in its cache (a cached
    prefix included) when a chunk's forward starts; decode steps hear no chunk."""
    heard: list = []
    seam.set_row_hook(loaded.model, lambda uids, chunk: heard.append(chunk) or False, "probe")
    try:
        gen = _gen(loaded, chunk=4)
        prompt = list(range(5, 19))  # 14 tokens: 3 cached, then chunks of 4
        (uid,) = gen.insert_segments([[prompt[3:]]], max_tokens=[2], all_tokens=[prompt[:3]])
        while not any(r.uid == uid and r.finish_reason for r in gen.next()[1]):
            pass
    finally:
        seam._ROW_HOOKS[id(loaded.model)].pop("probe")
    chunks = [c for c in heard if c is not None]
    assert chunks[:3] == [[(3, 4)], [(7, 4)], [(11, 2)]]  # the last token goes to decode
    assert None in heard


def test_swap_embedding_puts_a_wrapper_in_the_text_models_place(tiny_model_dir):
    model = load_model(tiny_model_dir, "tiny").model
    ids = mx.array([[5, 6, 7]])
    before = model(ids)

    class Passing(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.calls = inner, 0

        def __call__(self, x):
            self.calls += 1
            return self.inner(x)

        def as_linear(self, x):
            return self.inner.as_linear(x)

    wrapper = seam.swap_embedding(model, Passing)
    after = model(ids)
    assert wrapper.calls == 1 and mx.array_equal(before, after)
