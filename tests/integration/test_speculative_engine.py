"""Speculative decoding in the engine (in process, the tiny models): it changes no token.

The draft is the target itself (every draft accepted: the multi-token path and long runs)
or a different model of the same tokenizer (most drafts rejected: the KV trimming path).
"""

from __future__ import annotations

import threading

import pytest

from mlxd.shared.params import GenerationParams
from mlxd.worker.engine.draft_model import DraftMismatch, load_draft, spec_config
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.rows import Submission
from mlxd.worker.engine.step.draft import NgramDrafter
from mlxd.worker.model.load import load_model

PROMPTS = [
    "def area(w, h):\n    return w * h\n\ndef area(w, h):\n    return w * h\n",
    "The quick brown fox jumps over the lazy dog.",
    "1, 2, 3, 4, 5, 6, 7, 8,",
]


@pytest.fixture(scope="module")
def target(tiny_model_dir):
    return load_model(tiny_model_dir, "tiny")


@pytest.fixture(scope="module")
def other(tiny_model_dir_b, target):
    return load_draft(tiny_model_dir_b, target)  # same tokenizer, other weights


def _run(loaded, spec, params: list[GenerationParams], prompts=PROMPTS, batch=8):
    """Each prompt's text, all submitted at once; the engine's spec stats."""
    engine = Engine(loaded, batch=batch, warmup=False, spec=spec)
    engine.start()
    texts, done = {}, {}
    for i, (text, p) in enumerate(zip(prompts, params, strict=True)):
        texts[i], done[i] = [], threading.Event()

        def sink(ev, i=i):
            assert ev.error is None, ev.error
            texts[i].append(ev.text)
            if ev.finish_reason is not None:
                done[i].set()

        engine.submit(Submission(f"r{i}", loaded.tokenizer.encode(text), p, sink))
    for ev in done.values():
        assert ev.wait(120)
    engine.stop()
    assert engine.join(30)
    return ["".join(texts[i]) for i in sorted(texts)], spec.stats if spec else None


GREEDY = GenerationParams(max_tokens=40, temperature=0.0)
SEEDED = GenerationParams(max_tokens=40, temperature=0.9, seed=11)


@pytest.mark.parametrize("mode", ["self", "other", "ngram"])
def test_a_lone_row_gives_the_same_text_with_speculation(target, other, mode):
    for prompt in PROMPTS:
        plain, _ = _run(target, None, [GREEDY], [prompt])
        draft = {"self": target, "other": other, "ngram": None}[mode]
        spec = spec_config("ngram" if mode == "ngram" else "draft", 4, draft)
        fast, stats = _run(target, spec, [GREEDY], [prompt])
        assert fast == plain
        if mode != "ngram":  # a draft model always drafts
            assert stats.steps > 0 and stats.drafted > 0
    if mode == "self":  # its own drafts are its own greedy tokens: all accepted
        assert stats.accepted == stats.drafted
    if mode == "other":  # most are rejected: the cache is trimmed back every step
        assert stats.accepted < stats.drafted


def test_a_draft_that_catches_up_over_several_steps_gives_the_same_text(target, monkeypatch):
    # A chunk of 8 tokens: the draft reads the prompt over several steps, then drafts.
    monkeypatch.setattr("mlxd.worker.engine.step.draft.CATCH_UP_CHUNK", 8)
    long_prompt = [PROMPTS[0] * 3]
    plain, _ = _run(target, None, [GREEDY], long_prompt)
    fast, stats = _run(target, spec_config("draft", 4, target), [GREEDY], long_prompt)
    assert fast == plain
    assert stats.drafted > 0 and stats.accepted == stats.drafted


def test_a_seeded_row_gives_the_same_text_with_and_without_speculation(target, other):
    plain, _ = _run(target, None, [SEEDED], PROMPTS[:1])
    for draft in (target, other):
        first, stats = _run(target, spec_config("draft", 3, draft), [SEEDED], PROMPTS[:1])
        again, _ = _run(target, spec_config("draft", 3, draft), [SEEDED], PROMPTS[:1])
        assert first == again == plain
        assert stats.drafted > 0


def test_batched_rows_and_a_row_left_alone_give_the_same_text(target):
    # Three rows share the batch, then the ones that finish early leave one row alone (it
    # moves to the lone path and speculates), all with the texts of plain decoding.
    params = [
        GenerationParams(max_tokens=n, temperature=t, seed=3)
        for n, t in ((8, 0), (12, 0.8), (48, 0))
    ]
    plain, _ = _run(target, None, params)
    fast, stats = _run(target, spec_config("draft", 4, target), params)
    assert fast == plain
    assert stats.accepted > 0


def test_a_request_can_opt_out(target):
    off = GenerationParams(max_tokens=20, temperature=0.0, speculative=False)
    _, stats = _run(target, spec_config("draft", 4, target), [off], PROMPTS[:1])
    assert stats.steps == 0


def test_prompt_lookup_drafts_what_followed_the_last_occurrence():
    d = NgramDrafter()
    tokens = [1, 2, 3, 4, 5, 9, 1, 2, 3]
    assert d.propose(tokens, 3) == [4, 5, 9]
    tokens += [7, 2, 3]  # (2, 3) last followed by 7 now, and (7, 2, 3) was never seen
    assert d.propose(tokens, 2) == [7, 2]
    assert NgramDrafter().propose([5, 6, 7, 8], 4) == []  # nothing repeats: no draft
    assert NgramDrafter().propose([4, 8, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]  # a period goes on


def test_a_draft_model_with_another_tokenizer_is_refused(tmp_path, tiny_model_dir, target):
    import shutil

    from tokenizers import Tokenizer

    bad = tmp_path / "bad-draft"
    shutil.copytree(tiny_model_dir, bad)
    tok = Tokenizer.from_file(str(bad / "tokenizer.json"))
    tok.add_tokens(["<|an_extra_token|>"])
    tok.save(str(bad / "tokenizer.json"))
    with pytest.raises(DraftMismatch, match="same tokenizer"):
        load_draft(bad, target)
