"""Image rows in the engine (worker/vision/): each row's greedy tokens are mlx-vlm's own
generation on the same chat and images (tests/tiny_vlm.py's oracle), whether it runs alone,
beside text rows and other image rows in one batch, or with its images cut across prefill
chunks; text rows beside them stay mlx-lm's own."""

from __future__ import annotations

import hashlib
import threading

from tiny_vlm import image, oracle

from mlxd.shared.params import GenerationParams
from mlxd.worker.engine.loop import Engine
from mlxd.worker.engine.rows import Submission
from mlxd.worker.engine.sched.planner import PlanConfig
from mlxd.worker.model import mlx_lm_seam as seam
from mlxd.worker.vision.ids import BASE
from mlxd.worker.vision.prompt import process

TOKENS = 10


def png_hash(img) -> str:
    return hashlib.sha256(img.tobytes()).hexdigest()


def chat(text: str, n_images: int) -> list[dict]:
    parts = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": text}]
    return [{"role": "user", "content": parts if n_images else text}]


class Row:
    def __init__(self, rid, prompt, images=None):
        self.tokens: list[int] = []
        self.error = None
        self.done = threading.Event()
        params = GenerationParams(max_tokens=TOKENS, temperature=0.0, logprobs=True)
        self.sub = Submission(rid, prompt, params, self._sink, images=images)

    def _sink(self, ev):
        self.tokens += [e["token_id"] for e in ev.logprobs or []]
        self.error = self.error or ev.error
        if ev.finish_reason is not None:
            self.done.set()


def image_row(vlm, rid: str, text: str, imgs: list):
    """(the engine's row, mlx-vlm's tokens) for a chat about `imgs`."""
    from mlx_vlm.prompt_utils import get_chat_template

    _, path, _, parts = vlm
    messages = chat(text, len(imgs))
    rendered = get_chat_template(parts.processor, messages, add_generation_prompt=True)
    ids, vin = process(parts, rendered, imgs, [png_hash(i) for i in imgs])
    want_ids, want = oracle(path, messages, imgs, TOKENS)
    assert vin.ids == want_ids  # the processor's prompt is mlx-vlm's own
    assert sum(t >= BASE for t in ids) == sum(t == parts.image_id for t in want_ids) > 0
    return Row(rid, ids, vin), want


def text_row(vlm, rid: str, text: str):
    _, path, loaded, parts = vlm
    want_ids, want = oracle(path, chat(text, 0), [], TOKENS)
    return Row(rid, want_ids), want


def run(engine: Engine, rows: list[Row]) -> None:
    engine.start()
    try:
        for r in rows:
            engine.submit(r.sub)
        assert all(r.done.wait(120) for r in rows)
    finally:
        engine.stop()
        assert engine.join(30)


def check(row: Row, want: list[int]) -> None:
    assert row.error is None, row.error
    assert len(row.tokens) >= 3 and row.tokens == want[: len(row.tokens)], row.sub.rid
    assert len(row.tokens) == len(want) or len(row.tokens) == TOKENS


def test_an_image_row_gives_mlx_vlms_own_tokens(vlm):
    row, want = image_row(vlm, "img", "What is in this picture?", [image(1)])
    _, _, loaded, parts = vlm
    run(Engine(loaded, batch=2, warmup=False, vision=parts), [row])
    check(row, want)
    other, other_want = image_row(vlm, "img2", "What is in this picture?", [image(2)])
    assert other_want != want  # the image decides the answer: the comparison has teeth


def test_image_rows_and_text_rows_share_a_batch(vlm):
    rows = [
        image_row(vlm, "a", "Describe it.", [image(3)]),
        text_row(vlm, "t1", "Name three colours."),
        image_row(vlm, "b", "Compare these two.", [image(4), image(5)]),
        text_row(vlm, "t2", "Say hello."),
    ]
    _, _, loaded, parts = vlm
    run(Engine(loaded, batch=4, warmup=False, vision=parts), [r for r, _ in rows])
    for row, want in rows:
        check(row, want)
    assert not parts.rows.rows  # every row's features were let go once placed


def test_images_cut_across_prefill_chunks_still_give_mlx_vlms_tokens(vlm):
    """Chunks of 3 tokens cut every image's run of tokens: the features placed in each chunk
    are the ones of its own positions."""
    rows = [
        image_row(vlm, "a", "Describe it.", [image(6)]),
        image_row(vlm, "b", "And these?", [image(7), image(8)]),
    ]
    _, _, loaded, parts = vlm
    plan = PlanConfig(idle_chunk=3, step_budget=3, min_chunk=1)
    run(Engine(loaded, batch=2, plan=plan, warmup=False, vision=parts), [r for r, _ in rows])
    for row, want in rows:
        check(row, want)


def test_image_rows_prefilled_in_whole_blocks_give_mlx_vlms_tokens(vlm):
    """CUDA's whole-block prefill (worker/model/blocks.py), forced here: a forward is padded
    past its longest chunk (the last piece of a prompt that ends near its image), and the
    features still land on their own positions."""
    from mlxd.worker.model import blocks

    _, _, loaded, parts = vlm
    try:
        for block in (8, 12, 16):
            rows = [image_row(vlm, "a", "", [image(6)]), image_row(vlm, "b", "?", [image(7)])]
            plan = PlanConfig(idle_chunk=block, step_budget=block, min_chunk=1, block=block)
            blocks.set_block(block)
            seam.patch_prompt_blocks()
            engine = Engine(loaded, batch=2, plan=plan, warmup=False, vision=parts)
            run(engine, [r for r, _ in rows])
            for row, want in rows:
                check(row, want)
    finally:
        blocks.set_block(0)
