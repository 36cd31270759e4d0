"""Image rows under the engine's harder paths, each checked against mlx-vlm's own greedy
generation on the same chat and images (tests/tiny_vlm.py's oracle): preempted for KV and
resumed (its features encoded again), with repetition and presence penalties (content ids
past the vocabulary are no tokens to penalize), and under prompt-lookup speculation."""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import pytest
from tiny_vlm import image, oracle

from mlxd.shared.params import GenerationParams
from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.rows import Submission
from mlxd.worker.vision.ids import BASE
from mlxd.worker.vision.prompt import process

# About 230 prompt tokens: admitted on prompt + one block (512 positions), a row outgrows
# its reservation after ~280 tokens.
NOTES = " ".join(f"Note {i}: {i * 3} ships." for i in range(16))


ORACLE: dict = {}  # mlx-vlm's tokens, by everything they depend on: tests share rows


def messages(text: str, n_images: int) -> list[dict]:
    parts = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": text}]
    return [{"role": "user", "content": parts}]


class Row:
    def __init__(self, rid, prompt, images, params):
        self.tokens: list[int] = []
        self.events: list = []
        self.done = threading.Event()
        self.sub = Submission(rid, prompt, params, self._sink, images=images)

    def _sink(self, ev):
        self.events.append(ev)
        self.tokens += [e["token_id"] for e in ev.logprobs or []]
        if ev.finish_reason is not None:
            self.done.set()

    @property
    def error(self):
        return next((ev.error for ev in self.events if ev.error is not None), None)


def image_row(vlm, rid, text, imgs, max_tokens, **kw):
    """(the engine's row, mlx-vlm's tokens for it); `kw`: sampling both sides take."""
    from mlx_vlm.prompt_utils import get_chat_template

    _, path, _, parts = vlm
    msgs = messages(text, len(imgs))
    rendered = get_chat_template(parts.processor, msgs, add_generation_prompt=True)
    hashes = [hashlib.sha256(i.tobytes()).hexdigest() for i in imgs]
    ids, vin = process(parts, rendered, imgs, hashes)
    key = (path, rid, text, tuple(hashes), max_tokens, repr(sorted(kw.items())))
    if key not in ORACLE:
        ORACLE[key] = oracle(path, msgs, imgs, max_tokens, **kw)[1]
    want = ORACLE[key]
    params = GenerationParams(
        max_tokens=max_tokens,
        temperature=0.0,
        top_p=1.0,
        top_k=0,
        logprobs=True,
        logit_bias=kw.get("logit_bias") or {},
        repetition_penalty=kw.get("repetition_penalty"),
        presence_penalty=kw.get("presence_penalty"),
    )
    return Row(rid, ids, vin, params), want


def run(engine: Engine, rows: list[Row], steps: list | None = None) -> dict:
    for r in rows:
        engine.submit(r.sub)
    engine.start()
    try:
        assert all(r.done.wait(120) for r in rows)
        return engine.stats()
    finally:
        engine.stop()
        assert engine.join(30)


@pytest.mark.parametrize("cached", [True, False], ids=["parked-in-ram-cache", "recomputed"])
def test_a_preempted_image_row_resumes_with_mlx_vlms_tokens(vlm, cached):
    """Two image rows, room for both at prompt + one block only: as the older outgrows its
    block the newer is preempted, and resumed once there is room, its image's features
    encoded again for whatever of its prompt the cache no longer holds."""
    _, _, loaded, parts = vlm
    no_end = dict.fromkeys(loaded.eos_ids, -100.0)
    out = 300
    rows = [
        image_row(vlm, f"r{i}", NOTES, [image(40 + i)], out, logit_bias=no_end) for i in range(2)
    ]
    assert 200 < len(rows[0][0].sub.prompt) < 256, len(rows[0][0].sub.prompt)
    steps: list = []
    engine = Engine(
        loaded,
        batch=4,
        warmup=False,
        vision=parts,
        kv_budget_bytes=2 * loaded.kv_cost.padded_row_bytes(512),
        cache=PromptCache(1 << 30, None, 0) if cached else None,
        trace=steps.append,
    )
    stats = run(engine, [r for r, _ in rows])
    assert [rid for st in steps for rid in st.preempted] == ["r1"]
    assert stats["preemptions"] == 1
    for row, want in rows:
        assert row.error is None, row.error
        assert row.tokens == want, row.sub.rid
    assert not parts.rows.rows


def test_penalties_on_an_image_row_give_mlx_vlms_tokens(vlm):
    """The penalties' window holds the image's content ids (past the vocabulary): they
    penalize nothing, and the row's tokens are mlx-vlm's with the same penalties."""
    _, _, loaded, parts = vlm
    # A bias makes one token the model's favourite: unpenalized it comes back again and again.
    (bang,) = loaded.tokenizer.encode("!", add_special_tokens=False)
    bias = {bang: 12.0}
    kw = {"repetition_penalty": 3.0, "presence_penalty": 8.0}
    text = "Describe it. " * 3
    rows = [image_row(vlm, "p", text, [image(50)], 24, logit_bias=bias, **kw)]
    run(Engine(loaded, batch=2, warmup=False, vision=parts), [r for r, _ in rows])
    row, want = rows[0]
    _, unpenalized = image_row(vlm, "p0", text, [image(50)], 24, logit_bias=bias)
    assert row.error is None, row.error
    assert row.tokens == want
    assert want != unpenalized  # the penalties bite: the comparison has teeth


def test_prompt_lookup_speculation_on_an_image_row_gives_mlx_vlms_tokens(vlm, monkeypatch):
    """Prompt lookup drafts from the row's own tokens, the image's among them: the row
    writes the token its text repeated right before the image (a logit bias), so the
    lookup's first match is followed by the image's content ids. A draft stops there (the
    model never writes one), and the row's tokens stay mlx-vlm's."""
    from mlxd.worker.engine.draft_model import spec_config
    from mlxd.worker.engine.step.draft import NgramDrafter

    family, path, loaded, parts = vlm
    if family != "mistral3":
        pytest.skip("gemma3's sliding windows turn speculation off")
    drafts: list[list[int]] = []
    propose = NgramDrafter.propose

    def spy(self, tokens, k):
        drafts.append(out := propose(self, tokens, k))
        return out

    monkeypatch.setattr(NgramDrafter, "propose", spy)
    from mlx_vlm.prompt_utils import get_chat_template

    bang = loaded.tokenizer.encode("!", add_special_tokens=False)
    assert len(bang) == 1
    img = image(60)
    msgs = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Look!!!!"}, {"type": "image"}],
        }
    ]
    rendered = get_chat_template(parts.processor, msgs, add_generation_prompt=True)
    ids, vin = process(parts, rendered, [img], [hashlib.sha256(img.tobytes()).hexdigest()])
    first = next(i for i, t in enumerate(ids) if t >= BASE)
    assert ids[first - 2 : first] == bang * 2
    bias = {bang[0]: 100.0}
    _, want = oracle(path, msgs, [img], 12, logit_bias=bias)
    params = GenerationParams(max_tokens=12, temperature=0.0, logprobs=True, logit_bias=bias)
    row = Row("s", ids, vin, params)
    spec = spec_config("ngram", 4, None)
    run(Engine(loaded, batch=1, warmup=False, vision=parts, spec=spec), [row])
    assert row.error is None, row.error
    assert row.tokens == want
    assert spec.stats.drafted > 0, spec.stats  # it speculated
    assert [] in drafts and all(t < BASE for d in drafts for t in d), drafts


def test_an_image_row_with_a_lora_adapter_gives_mlx_lms_tokens_on_mlx_vlms_embeddings(
    vlm, tmp_path
):
    """One model, an adapter and an image: the row's tokens are mlx-lm's generation with
    the adapter over mlx-vlm's merged embeddings of the prompt (its image features in), and
    differ from the same row without the adapter."""
    import mlx.core as mx
    from lora_adapters import make_adapter, mlx_lm_model
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_logits_processors

    family, path, loaded, parts = vlm
    if family != "mistral3":
        pytest.skip("gemma3's text model scales the embeddings it is given itself")
    adapter = make_adapter(path, tmp_path, "all")
    no_end = dict.fromkeys(loaded.eos_ids, -1e4)
    row, plain = image_row(vlm, "lora", "Describe it.", [image(70)], 12, logit_bias=no_end)
    base = Row("base", row.sub.prompt, row.sub.images, row.sub.params)
    row.sub.adapter = "all"
    engine = Engine(loaded, batch=4, warmup=False, vision=parts)
    engine.start()
    try:
        job_done = threading.Event()

        class Mount:
            error = None

            def run(self, stream):
                try:
                    with mx.stream(stream):
                        engine.adapters.mount("all", adapter)
                except Exception as exc:  # noqa: BLE001
                    self.error = exc
                job_done.set()

            def fail(self, err):
                self.error = err
                job_done.set()

        mount = Mount()
        engine.run_job(mount)
        assert job_done.wait(30) and mount.error is None, mount.error
        for r in (row, base):
            engine.submit(r.sub)
        assert row.done.wait(60) and base.done.wait(60)
    finally:
        engine.stop()
        assert engine.join(30)
    assert row.error is None and base.error is None, (row.error, base.error)
    assert base.tokens == plain  # without the adapter: mlx-vlm's own
    vin = row.sub.images
    ids = mx.array([vin.ids])
    extra = {k: mx.array(v) for k, v in vin.arrays.items() if k != "pixel_values"}
    embeds = parts.vlm.get_input_embeddings(
        ids, mx.array(vin.arrays["pixel_values"]), mask=mx.ones_like(ids), **extra
    )
    embeds = getattr(embeds, "inputs_embeds", embeds)
    model = mlx_lm_model(path, adapter)
    out = generate_step(
        ids[0],
        model,
        input_embeddings=embeds[0],
        max_tokens=12,
        logits_processors=make_logits_processors(logit_bias=no_end),
    )
    want = [int(t) for t, _ in out]
    assert row.tokens == want
    assert want != plain  # the adapter changes the answer: the comparison has teeth


@pytest.mark.parametrize("size", [(1, 4000), (4000, 1), (3, 100)])
def test_a_strip_of_an_image_is_answered_shrunk_to_one_pixel_across(vlm, size):
    """Pixtral keeps an image's aspect ratio as it shrinks it to its longest edge, so a thin
    strip (a 1×4000 progress bar) shrinks to zero pixels across and mlx-vlm's processor
    fails: such an image is shrunk to the longest edge and one pixel across first, and the
    row's tokens are mlx-vlm's on that. An image in a conversation's history that failed
    would fail every later turn of it. Gemma 3's square resize takes any strip as it is."""
    from mlxd.worker.vision.prompt import fit_aspect

    family, _, _, parts = vlm
    strip = image(80, size)
    padded = fit_aspect(parts, strip)
    if family == "gemma3":
        assert padded is strip
    else:
        assert sorted(padded.size) == [1, 32]  # the tiny processor's longest edge
        assert (padded.size[0] > padded.size[1]) == (size[0] > size[1])
    row, want = image_row(vlm, f"strip{size}", "What?", [padded], 8)
    _, _, loaded, _ = vlm
    hashes = [hashlib.sha256(strip.tobytes()).hexdigest()]
    from mlx_vlm.prompt_utils import get_chat_template

    rendered = get_chat_template(parts.processor, messages("What?", 1), add_generation_prompt=True)
    ids, vin = process(parts, rendered, [strip], hashes)  # the strip itself, as a client sends
    assert vin.ids == row.sub.images.ids
    engine_row = Row("strip", ids, vin, row.sub.params)
    run(Engine(loaded, batch=2, warmup=False, vision=parts), [engine_row])
    assert engine_row.error is None, engine_row.error
    assert engine_row.tokens == want


def test_a_strip_is_never_padded_to_its_length():
    """A 1×50,000,000 PNG (a few kB, within image_max_pixels) is shrunk, not padded: its
    padding to one patch across would be gigabytes."""
    from types import SimpleNamespace

    from PIL import Image

    from mlxd.worker.vision.prompt import fit_aspect

    parts = SimpleNamespace(
        processor=SimpleNamespace(image_processor=SimpleNamespace(size={"longest_edge": 1540}))
    )
    strip = Image.new("RGB", (1, 2_000_000))
    assert fit_aspect(parts, strip).size == (1, 1540)  # type: ignore[arg-type]
    wide = Image.new("RGB", (4000, 3))
    assert fit_aspect(parts, wide) is wide  # 3 px keep one across: as it is


def test_a_row_cancelled_inside_its_image_leaves_a_prefix_the_next_one_finishes(vlm):
    """Prefill in chunks of 3 and the client leaves once the row's KV ends inside its image:
    the partial prefix goes to the prompt cache, and the same request again starts from it,
    encoding the image's features for the rest of its positions only. Its tokens are
    mlx-vlm's."""
    from mlxd.shared.errors import Unavailable
    from mlxd.worker.engine.sched.planner import PlanConfig

    _, _, loaded, parts = vlm
    first, want = image_row(vlm, "c1", "What?", [image(90)], 8)
    again = Row("c2", first.sub.prompt, first.sub.images, first.sub.params)
    positions = [i for i, t in enumerate(first.sub.prompt) if t >= BASE]
    # the first step whose chunks end strictly inside the image's run
    cut = next(k for k in range(1, 100) if positions[0] < 3 * k <= positions[-1])
    engine = Engine(
        loaded,
        batch=2,
        warmup=False,
        vision=parts,
        cache=PromptCache(1 << 30, None, 0),
        plan=PlanConfig(idle_chunk=3, step_budget=3, min_chunk=1),
        trace=lambda st: st.step == cut and engine.cancel(first.sub, Unavailable("gone")),
    )
    engine.start()
    try:
        engine.submit(first.sub)
        assert first.done.wait(60)
        assert isinstance(first.error, Unavailable) and not first.tokens
        engine.submit(again.sub)
        assert again.done.wait(60)
    finally:
        engine.stop()
        assert engine.join(30)
    assert positions[0] < again.sub.prompt_cached == 3 * cut <= positions[-1]
    assert again.error is None, again.error
    assert again.tokens == want
    assert not parts.rows.rows


def test_a_placement_left_by_a_forward_that_never_ran_reaches_no_other_forward():
    """Features placed for a forward that then never ran (a later row hook raised, the
    step failed) must not land in the next forward's embedding, whatever its shape: each
    forward's hook call places its own features or none."""
    import mlx.core as mx
    import mlx.nn as nn

    from mlxd.worker.vision.embed import ImageEmbedding, ImageRows, Placed, RowImages

    emb = ImageEmbedding(nn.Embedding(8, 4), image_id=3)
    rows = ImageRows(emb)
    stale = Placed((1, 2), mx.array([0], dtype=mx.uint32), mx.ones((1, 4)) * 99)
    emb.place(stale)
    rows([7], [(0, 2)])  # a text row's prefill: nothing of its own to place
    ids = mx.array([[1, 2]])
    assert mx.array_equal(emb(ids), emb.inner(ids)).item()
    emb.place(stale)
    rows([7], None)  # a decode step
    assert mx.array_equal(emb(mx.array([[1]])), emb.inner(mx.array([[1]]))).item()
    emb.place(stale)
    rows.bind(5, RowImages(np.array([1]), mx.ones((1, 4))))
    rows.reset()  # a rebuilt batch
    assert mx.array_equal(emb(ids), emb.inner(ids)).item()
