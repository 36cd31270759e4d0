"""No request parameter can wedge or crash a worker's engine (issue 11).

Against a real worker: parameters the sampler would fail on are a 400 in the surface's own
envelope, and the worker answers normally afterwards; text too long for the context is refused
before it is tokenized. In process: a step that fails rebuilds the batch, fails only the row
that caused it and carries the others over; a batch that cannot be rebuilt marks the engine dead.
"""

from __future__ import annotations

import json
import threading

import pytest

from mlxd.shared.params import GenerationParams
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.rows import Submission
from mlxd.worker.engine.sched.planner import PlanConfig
from mlxd.worker.engine.steplog import StepLog
from mlxd.worker.model.load import load_model

from procs import CONTEXT_LIMIT, MAX_BODY_BYTES

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def vocab(tiny_model_dir) -> int:
    return json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"]


def _openai_error(r, param: str | None = None) -> dict:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    if param:
        assert err["param"] == param
    return err


def _anthropic_error(r) -> dict:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    return body["error"]


def _chat_ok(http) -> None:
    r = http.post(CHAT, json={"messages": MSG, "max_tokens": 4, "temperature": 1.0, "seed": 1})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("top_k", [10**9, 2**63, "vocab"])
def test_top_k_beyond_the_vocabulary_is_a_400_and_the_worker_still_answers(http, vocab, top_k):
    top_k = vocab if top_k == "vocab" else top_k
    err = _openai_error(
        http.post(
            CHAT, json={"messages": MSG, "max_tokens": 4, "temperature": 1.0, "top_k": top_k}
        ),
        "top_k",
    )
    assert str(vocab) in err["message"]
    _chat_ok(http)
    r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4, "top_k": top_k})
    _openai_error(r, "top_k")
    _chat_ok(http)


def test_top_k_inside_the_vocabulary_still_samples(http, vocab):
    for top_k in (-1, 0, 1, vocab - 1):
        r = http.post(
            CHAT, json={"messages": MSG, "max_tokens": 3, "temperature": 1.0, "top_k": top_k}
        )
        assert r.status_code == 200, (top_k, r.text)


def test_anthropic_top_k_beyond_the_vocabulary_is_a_400_in_its_envelope(http):
    r = http.post(MESSAGES, json={"messages": MSG, "max_tokens": 4, "top_k": 2**63})
    assert "top_k" in _anthropic_error(r)["message"]
    r = http.post(MESSAGES, json={"messages": MSG, "max_tokens": 4, "top_k": 5})
    assert r.status_code == 200 and r.json()["type"] == "message", r.text


@pytest.mark.parametrize("seed", [-(2**63), -1, 2**64])
def test_a_seed_out_of_range_is_a_400(http, seed):
    r = http.post(CHAT, json={"messages": MSG, "max_tokens": 4, "temperature": 1.0, "seed": seed})
    _openai_error(r, "seed")
    _chat_ok(http)


def test_the_largest_seed_samples(http):
    r = http.post(
        CHAT, json={"messages": MSG, "max_tokens": 4, "temperature": 1.0, "seed": 2**64 - 1}
    )
    assert r.status_code == 200, r.text


def test_logit_bias_keys_outside_the_vocabulary_are_a_400(http, vocab):
    for key in (str(vocab), "18446744073709551616", "-3"):
        r = http.post(CHAT, json={"messages": MSG, "max_tokens": 4, "logit_bias": {key: 5.0}})
        _openai_error(r, "logit_bias")
    r = http.post(
        CHAT, json={"messages": MSG, "max_tokens": 4, "logit_bias": {str(vocab - 1): 5.0}}
    )
    assert r.status_code == 200, r.text


def test_completion_token_ids_outside_the_vocabulary_are_a_400(http, vocab):
    for ids in ([1, vocab], [-1, 2]):
        _openai_error(http.post("/v1/completions", json={"prompt": ids, "max_tokens": 2}), "prompt")
    r = http.post("/v1/completions", json={"prompt": [1, vocab - 1], "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_token_budgets_beyond_the_context_are_clamped_on_every_surface(http):
    # Issue 12: a budget larger than the room left is clamped to it (never a 400, never past
    # the context); the row ends at the room or earlier, at the model's own end of turn.
    r = http.post(MESSAGES, json={"messages": MSG, "max_tokens": 2**63})
    assert r.status_code == 200, r.text
    u = r.json()["usage"]
    assert u["input_tokens"] + u["cache_read_input_tokens"] + u["output_tokens"] <= CONTEXT_LIMIT
    assert r.json()["stop_reason"] in ("max_tokens", "end_turn")
    r = http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 10**12})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["total_tokens"] <= CONTEXT_LIMIT
    r = http.post(CHAT, json={"messages": MSG, "max_completion_tokens": 2**63})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["total_tokens"] <= CONTEXT_LIMIT


def test_a_budget_past_the_room_ends_at_the_room_with_length_on_every_surface(http):
    # Issue 18: a prompt near the context's end leaves a few tokens of room; a larger budget
    # gets exactly that room (unless the model ends its turn first), and says "length".
    ids = [5] * (CONTEXT_LIMIT - 6)
    r = http.post("/v1/completions", json={"prompt": ids, "max_tokens": 10**9})
    assert r.status_code == 200, r.text
    u, finish = r.json()["usage"], r.json()["choices"][0]["finish_reason"]
    assert u["prompt_tokens"] == CONTEXT_LIMIT - 6 and u["completion_tokens"] <= 6
    assert finish == "stop" or (finish == "length" and u["completion_tokens"] == 6)
    long_text = "hi " * (CONTEXT_LIMIT // 2 - 40)  # two tokens each: room to spare
    r = http.post(
        CHAT, json={"messages": [{"role": "user", "content": long_text}], "max_tokens": 2**63}
    )
    assert r.status_code == 200, r.text
    u, finish = r.json()["usage"], r.json()["choices"][0]["finish_reason"]
    assert u["total_tokens"] <= CONTEXT_LIMIT
    assert finish == "stop" or (finish == "length" and u["total_tokens"] == CONTEXT_LIMIT)
    body = {"model": "tiny", "prompt": long_text, "stream": False}
    r = http.post("/api/generate", json={**body, "options": {"num_predict": 10**9}})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["prompt_eval_count"] + out["eval_count"] <= CONTEXT_LIMIT
    assert out["done_reason"] == "stop" or (
        out["done_reason"] == "length"
        and out["prompt_eval_count"] + out["eval_count"] == CONTEXT_LIMIT
    )


def test_only_a_prompt_with_no_room_left_is_refused_with_the_numbers(http):
    r = http.post("/v1/completions", json={"prompt": [5] * CONTEXT_LIMIT, "max_tokens": 4})
    err = _openai_error(r, "prompt")  # the field that holds it (was "messages" until 12-07)
    assert err["code"] == "context_length_exceeded"
    assert f"{CONTEXT_LIMIT} tokens" in err["message"] and "context limit" in err["message"]
    ok = http.post("/v1/completions", json={"prompt": [5] * (CONTEXT_LIMIT - 1), "max_tokens": 9})
    assert ok.status_code == 200, ok.text
    assert ok.json()["usage"]["completion_tokens"] == 1
    assert ok.json()["choices"][0]["finish_reason"] in ("length", "stop")


def test_a_long_stop_string_is_a_400_on_both_surfaces(http):
    long = "x" * 10_000
    _openai_error(http.post(CHAT, json={"messages": MSG, "stop": [long]}), "stop")
    _anthropic_error(
        http.post(MESSAGES, json={"messages": MSG, "max_tokens": 4, "stop_sequences": [long]})
    )


# Under the body cap, far over what the context can hold: refused before tokenizing, with
# the context check's code. "at least" shows the byte bound answered, not the tokenizer.
HUGE = "lorem ipsum " * ((MAX_BODY_BYTES - 4096) // 12)


@pytest.mark.parametrize(
    "path,body,param",
    [
        (CHAT, {"messages": [{"role": "user", "content": HUGE}]}, "messages"),
        ("/v1/completions", {"prompt": HUGE}, "prompt"),
        ("/v1/responses", {"input": HUGE}, "input"),
    ],
    ids=["chat", "completions", "responses"],
)
def test_a_huge_prompt_is_refused_before_tokenizing(http, path, body, param):
    err = _openai_error(http.post(path, json=body), param)
    assert err["code"] == "context_length_exceeded"
    assert "at least" in err["message"] and "context limit" in err["message"]
    _chat_ok(http)


def test_a_huge_prompt_on_messages_gets_the_anthropic_envelope(http):
    r = http.post(MESSAGES, json={"messages": [{"role": "user", "content": HUGE}], "max_tokens": 4})
    assert "context limit" in _anthropic_error(r)["message"]
    r = http.post(
        "/v1/messages/count_tokens", json={"messages": [{"role": "user", "content": HUGE}]}
    )
    assert "context limit" in _anthropic_error(r)["message"]


# -- the engine, in process ---------------------------------------------------------------
# A row that is still decoding when the test thread submits the next one, however fast the
# machine decodes (40 tokens took ~0.3 s here before OpenBLAS, ~0.1 s with it).
LONG = 400


class _Row:
    """One submission and what its sink received."""

    def __init__(self, rid: str, max_tokens: int = 40, processors=(), prompt=None, **params):
        self.events: list = []
        self.done = threading.Event()
        self.started = threading.Event()
        defaults = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
        p = GenerationParams(max_tokens=max_tokens, **{**defaults, **params})
        prompt = list(prompt or [5, 6, 7, 8, 9])
        self.sub = Submission(rid, prompt, p, self._sink, processors=list(processors))

    def _sink(self, ev) -> None:
        self.events.append(ev)
        if ev.completion_tokens >= 3:
            self.started.set()
        if ev.finish_reason is not None:
            self.done.set()

    @property
    def text(self) -> str:
        return "".join(ev.text for ev in self.events)

    @property
    def last(self):
        return self.events[-1]


def _wrong_shape(tokens, logits):
    # Returns cleanly, so no per-row guard sees it; the batch step itself then fails.
    return logits[:, :7]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(tiny_model_dir, "tiny")


@pytest.fixture
def engine(loaded):
    engine = Engine(loaded, batch=4)
    engine.start()
    yield engine
    engine.stop()
    assert engine.join(10)


def _run(engine: Engine, row: _Row) -> _Row:
    engine.submit(row.sub)
    assert row.done.wait(60)
    return row


def test_a_failed_step_fails_its_row_and_carries_the_others_over(engine):
    reference = _run(engine, _Row("reference", max_tokens=LONG))
    assert reference.last.error is None and reference.last.completion_tokens == LONG

    good = _Row("good", max_tokens=LONG)  # still decoding when `bad` comes, on any machine
    engine.submit(good.sub)
    assert good.started.wait(60)  # decoding: it has been through sampling already
    bad = _run(engine, _Row("bad", processors=[_wrong_shape]))
    assert good.done.wait(60)

    assert bad.last.finish_reason == "error" and bad.last.error.status == 503
    assert "bad" in bad.last.error.message and "worker log" in bad.last.error.message
    assert "shape" not in bad.last.error.message.lower()  # no exception text for clients
    # The good row went on where it was: all its tokens, the same greedy text.
    assert good.last.error is None and good.last.finish_reason == "length"
    assert good.last.completion_tokens == LONG and good.text == reference.text
    assert engine.recoveries == 1 and engine.dead is None

    after = _run(engine, _Row("after", max_tokens=LONG))
    assert after.last.error is None and after.text == reference.text
    assert engine.active_rows == 0


def test_a_sampler_that_raises_fails_its_row_without_a_rebuild(engine):
    good = _Row("good", max_tokens=LONG)
    engine.submit(good.sub)
    assert good.started.wait(60)
    # What the API's validator refuses (top_k beyond the vocabulary), handed to the engine.
    bad = _run(engine, _Row("bad", temperature=1.0, top_k=10**9))
    assert good.done.wait(60)
    assert bad.last.finish_reason == "error" and "top_k" not in bad.last.error.message
    assert good.last.error is None and good.last.completion_tokens == LONG
    assert engine.recoveries == 0
    assert _run(engine, _Row("after", max_tokens=5)).last.error is None


def test_a_batch_that_cannot_be_rebuilt_marks_the_engine_dead(loaded):
    engine = Engine(loaded, batch=4)
    engine.start()
    try:
        assert _run(engine, _Row("warm", max_tokens=3)).last.error is None

        def no_more_batches():
            raise MemoryError("cannot allocate the batch")

        engine._new_generator = no_more_batches
        good = _Row("good", max_tokens=LONG)
        engine.submit(good.sub)
        assert good.started.wait(60)
        bad = _run(engine, _Row("bad", processors=[_wrong_shape]))
        assert good.done.wait(60)
        for row in (good, bad):  # nothing left to run them on
            assert row.last.finish_reason == "error" and row.last.error.status == 503
            assert "allocate" not in row.last.error.message
        assert engine.join(10) and engine.dead is not None and "allocate" in engine.dead
        late = _Row("late", max_tokens=3)
        engine.submit(late.sub)
        assert late.done.is_set() and late.last.error.status == 503
    finally:
        engine.stop()


OOM = "[metal::malloc] Unable to allocate 8589934592 bytes; Insufficient Memory"


def _ordered(*rows: _Row) -> list[tuple[str, int, str | None]]:
    """One log of (rid, completion tokens, finish) across `rows`' sinks, in engine order."""
    log: list[tuple[str, int, str | None]] = []
    for row in rows:
        sink = row.sub.sink

        def logged(ev, rid=row.sub.rid, sink=sink):
            log.append((rid, ev.completion_tokens, ev.finish_reason))
            sink(ev)

        row.sub.sink = logged
    return log


def _oom_engine(loaded, monkeypatch, fails) -> Engine:
    """An engine whose steps fail with MLX's allocation error while `fails(engine)` says so
    (a real one needs a machine out of memory)."""
    from mlx_lm.generate import BatchGenerator

    real_next = BatchGenerator.next

    def next_or_oom(gen):
        if fails(engine):
            raise RuntimeError(OOM)
        return real_next(gen)

    monkeypatch.setattr(BatchGenerator, "next", next_or_oom)
    engine = Engine(loaded, batch=4)
    return engine


def _in_batch(engine: Engine, row: _Row) -> bool:
    return any(r.sub is row.sub for r in engine._batch.rows.values())


def test_a_new_row_that_never_fits_waits_for_the_others_then_fails_with_out_of_memory(
    loaded, monkeypatch
):
    # Issue 18, then 33: MLX failing to allocate whenever "hog" is in the batch. Prefilling
    # rows are first retried with the chunk halved (4096 down to the 64-token floor: six
    # retries, every row kept); then hog waits in the queue while the decoding row finishes
    # (sched/oom.py), is tried again alone, and only then fails, with a 503 saying so.
    hog = _Row("hog")
    engine = _oom_engine(loaded, monkeypatch, lambda e: _in_batch(e, hog))
    engine.start()
    try:
        reference = _run(engine, _Row("reference", max_tokens=LONG))
        good = _Row("good", max_tokens=LONG)
        log = _ordered(good, hog)
        engine.submit(good.sub)
        assert good.started.wait(60)
        _run(engine, hog)
        assert good.done.wait(60)
        assert hog.last.finish_reason == "error" and hog.last.error.status == 503
        assert hog.last.error.code == "out_of_memory" and "out of memory" in hog.last.error.message
        assert good.last.error is None and good.text == reference.text
        assert log.index(("hog", 0, "error")) > log.index(("good", LONG, "length"))
        assert hog.sub.oom_waits == 1 and engine.recoveries == 14
        assert engine.dead is None
        assert _run(engine, _Row("after", max_tokens=5)).last.error is None
    finally:
        engine.stop()
        assert engine.join(10)


def test_a_new_row_out_of_memory_beside_another_waits_and_answers_in_full(loaded, monkeypatch):
    # Memory too short for both rows at once (another process on the GPU): the newcomer is
    # not failed for it; it waits until the decoding row is done and then writes exactly
    # what it would have written alone.
    good, late = _Row("good", max_tokens=LONG), _Row("late", prompt=[9, 8, 7, 6, 5])
    engine = _oom_engine(loaded, monkeypatch, lambda e: _in_batch(e, good) and _in_batch(e, late))
    engine.start()
    try:
        reference = _run(engine, _Row("reference", prompt=[9, 8, 7, 6, 5]))
        log = _ordered(good, late)
        engine.submit(good.sub)
        assert good.started.wait(60)
        _run(engine, late)
        assert good.done.wait(60)
        assert late.last.error is None and late.last.completion_tokens == 40
        assert late.text == reference.text and good.last.error is None
        first_late = next(i for i, (rid, n, _) in enumerate(log) if rid == "late" and n > 0)
        assert first_late > log.index(("good", LONG, "length"))
        assert late.sub.oom_waits == 1 and engine.dead is None
    finally:
        engine.stop()
        assert engine.join(10)


def test_every_row_decoding_out_of_memory_the_newer_half_waits_and_no_text_changes(
    loaded, monkeypatch
):
    # An allocation failure while four rows decode (their KV grew past the device's memory):
    # the two oldest carry on, the two newest wait and resume where they stopped; every
    # row's greedy text is the one it writes alone, and nothing already sent is sent again.
    prompts = [[5 + i, 6, 7, 8, 9 + i] for i in range(4)]
    rows = [_Row(f"r{i}", prompt=p) for i, p in enumerate(prompts)]
    failed: list[bool] = []

    def once_all_decoding(e: Engine) -> bool:
        batch = list(e._batch.rows.values())
        if failed or len(batch) < 4 or any(r.generated < 3 or r.todo for r in batch):
            return False
        failed.append(True)
        return True

    engine = _oom_engine(loaded, monkeypatch, once_all_decoding)
    engine.start()
    try:
        alone = [_run(engine, _Row(f"alone{i}", prompt=p)).text for i, p in enumerate(prompts)]
        log = _ordered(*rows)
        for r in rows:
            engine.submit(r.sub)
        for r in rows:
            assert r.done.wait(60)
        assert failed and engine.recoveries == 1 and engine.dead is None
        assert [r.text for r in rows] == alone
        assert all(r.last.error is None and r.last.completion_tokens == 40 for r in rows)
        assert [r.sub.oom_waits for r in rows] == [0, 0, 1, 1]
        for r in rows:  # every token sent once: the counts only ever grow
            counts = [n for rid, n, _ in log if rid == r.sub.rid]
            assert counts == sorted(counts) and len(r.text) > 0
    finally:
        engine.stop()
        assert engine.join(10)


@pytest.mark.parametrize("where", ["generator", "after sampling"])
def test_seeded_rows_out_of_memory_write_what_they_write_alone(loaded, monkeypatch, where):
    # Sampled rows with a seed, all decoding, when an allocation fails: in mlx-lm's step, or
    # as MLX fails, at the evaluation after the next step was built (its keys split once more
    # for tokens never sent). Those that carry on and those that wait draw every token from
    # the key they would have had alone.
    from mlx_lm.generate import BatchGenerator

    from mlxd.worker.engine.step.decode import DecodeBatch

    prompts = [[5 + i, 6, 7, 8, 9 + i] for i in range(4)]
    failed: list[bool] = []
    live: dict[str, Engine] = {}

    def due() -> bool:
        batch = list(live["e"]._batch.rows.values()) if live else []
        if failed or len(batch) < 4 or any(r.generated < 3 or r.todo for r in batch):
            return False
        failed.append(True)
        return True

    if where == "generator":
        real_next = BatchGenerator.next

        def next_or_oom(gen):
            if due():
                raise RuntimeError(OOM)
            return real_next(gen)

        monkeypatch.setattr(BatchGenerator, "next", next_or_oom)
    else:
        real_launch = DecodeBatch._launch

        def launch_then_oom(self, fed):
            real_launch(self, fed)
            if due():
                raise RuntimeError(OOM)

        monkeypatch.setattr(DecodeBatch, "_launch", launch_then_oom)
    engine = Engine(loaded, batch=4)
    engine.start()
    try:
        seeded = {"temperature": 1.0}
        alone = [
            _run(engine, _Row(f"alone{i}", prompt=p, seed=100 + i, **seeded)).text
            for i, p in enumerate(prompts)
        ]
        rows = [_Row(f"r{i}", prompt=p, seed=100 + i, **seeded) for i, p in enumerate(prompts)]
        live["e"] = engine
        for r in rows:
            engine.submit(r.sub)
        for r in rows:
            assert r.done.wait(60)
        assert failed and engine.recoveries == 1
        assert [r.sub.oom_waits for r in rows] == [0, 0, 1, 1]
        assert [r.text for r in rows] == alone
    finally:
        engine.stop()
        assert engine.join(10)


def test_a_prefill_out_of_memory_once_is_retried_in_smaller_chunks_and_loses_nothing(
    loaded, monkeypatch, tmp_path
):
    # A transient allocation failure while a long prompt prefills (four 16k-token agent prompts
    # at once on a GPU): the rows are carried over, the chunks halved, and every answer is the
    # one it would have been; the worker never fails a request for it.
    from mlx_lm.generate import BatchGenerator

    real_next = BatchGenerator.next
    failed = []
    steps = tmp_path / "steps.jsonl"
    engine = Engine(
        loaded,
        batch=4,
        plan=PlanConfig(idle_chunk=64, step_budget=64, min_chunk=8),
        trace=StepLog(steps),
    )
    long = [(7 * i) % 400 + 10 for i in range(300)]

    def next_or_oom(gen):
        if not failed and any(r.todo > 0 and r.pos > 0 for r in engine._batch.rows.values()):
            failed.append(True)  # once, mid-prefill
            raise RuntimeError("[cuda::malloc] out of memory")
        return real_next(gen)

    reference = Engine(loaded, batch=4, plan=PlanConfig(idle_chunk=64, step_budget=64, min_chunk=8))
    reference.start()
    try:
        expected = _run(reference, _Row("ref", prompt=long)).text
    finally:
        reference.stop()
        assert reference.join(10)
    monkeypatch.setattr(BatchGenerator, "next", next_or_oom)
    engine.start()
    try:
        row = _run(engine, _Row("long", prompt=long))
        assert failed and row.last.error is None and row.text == expected
        assert engine.recoveries == 1 and engine._sched.oom_divisor == 2
        # The step log shows the failed step, then the halved chunks.
        lines = [json.loads(x) for x in steps.read_text().splitlines()]
        at = next(i for i, x in enumerate(lines) if x.get("failed"))
        assert lines[at]["failed"] == "RuntimeError" and lines[at]["chunk"] == 64
        assert lines[at + 1]["chunk"] == 32 and "failed" not in lines[at + 1]
        assert _run(engine, _Row("after", max_tokens=5)).last.error is None
        assert engine._sched.oom_divisor == 1  # an empty batch starts afresh
    finally:
        engine.stop()
        assert engine.join(10)


def test_a_responses_input_that_fills_the_context_names_input(http):
    r = http.post("/v1/responses", json={"input": "hello " * CONTEXT_LIMIT})
    err = _openai_error(r, "input")
    assert err["code"] == "context_length_exceeded"


# -- found by a black-box probe of the daemon (2026-12-07): each was a 500 or named the wrong
# field; against the real worker, which answers normally afterwards ------------------------
@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/responses", {"input": [{"role": "user", "content": 5}]}, "input.0.content"),
        ("/v1/responses", {"input": [{"type": "reasoning", "summary": 5}]}, "input.0.summary"),
        ("/v1/responses", {"input": []}, "input"),
        (
            CHAT,
            {"messages": MSG, "chat_template_kwargs": {"add_generation_prompt": False}},
            "chat_template_kwargs",
        ),
        (
            # Nested loops: this one rendered for hours, holding a thread of the worker's
            # executor (a few such requests and no prompt renders at all).
            CHAT,
            {
                "messages": MSG,
                "chat_template_kwargs": {
                    "chat_template": "{% for i in range(99999) %}{% for j in range(99999) %}"
                    "{% endfor %}{% endfor %}x"
                },
            },
            "chat_template_kwargs",
        ),
        (
            CHAT,
            {
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "messages": [
                    *MSG,
                    {"role": "assistant", "tool_calls": [{"id": "c", "function": None}]},
                    {"role": "tool", "tool_call_id": "c", "content": "r"},
                ],
            },
            "messages.1.tool_calls.0.function",
        ),
        ("/v1/completions", {"prompt": "hi", "echo": True, "logprobs": 1}, "logprobs"),
    ],
    ids=[
        "content",
        "reasoning",
        "empty-input",
        "template-kwargs",
        "template",
        "call-function",
        "echo",
    ],
)
def test_bad_items_are_a_400_naming_their_field(http, path, body, param):
    err = _openai_error(http.post(path, json={**body, "max_tokens": 2}), param)
    assert "Traceback" not in err["message"] and "mlx_lm" not in err["message"]
    _chat_ok(http)


def test_a_tool_result_of_the_wrong_type_is_a_400_on_messages_and_count_tokens(http):
    block = {"type": "tool_result", "tool_use_id": "x", "content": 5}
    body = {"max_tokens": 2, "messages": [{"role": "user", "content": [block]}]}
    for path in (MESSAGES, "/v1/messages/count_tokens"):
        assert (
            "messages.0.content.0.content"
            in _anthropic_error(http.post(path, json=body))["message"]
        )


def test_a_responses_message_cut_by_max_output_tokens_is_incomplete_streamed_or_not(http):
    body = {"input": "hi", "max_output_tokens": 1, "store": False, "temperature": 0}
    out = http.post("/v1/responses", json=body).json()
    assert out["status"] == "incomplete"
    assert [i["status"] for i in out["output"] if i["type"] == "message"] == ["incomplete"]
    with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["status"] for i in done if i["type"] == "message"] == ["incomplete"]
    assert events[-1]["type"] == "response.incomplete"
