"""A conversation's images are resized once: the family's image processor answers an image it
has seen from memory, and what it returns is what the processor itself returns for the whole
list, for both VLM families."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from mlx_vlm.utils import load_processor, prepare_inputs
from PIL import Image
from tiny_vlm import build_vlm

from mlxd.worker.vision.processor_memo import ProcessorMemo


def picture(seed: int, size=(120, 90)) -> Image.Image:
    rng = np.random.RandomState(seed)
    return Image.fromarray(rng.randint(0, 256, (size[1], size[0], 3), dtype=np.uint8))


class Counted:
    """The real image processor, counting the images it was given."""

    def __init__(self, inner):
        self.inner, self.images = inner, 0

    def __getattr__(self, name):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __call__(self, images, **kwargs):
        flat = images[0] if images and isinstance(images[0], list) else images
        self.images += len(flat)
        return self.inner(images, **kwargs)


@pytest.fixture(scope="module", params=["gemma3", "mistral3"])
def processors(request, tmp_path_factory):
    path = build_vlm(tmp_path_factory.mktemp(request.param), request.param)
    plain = load_processor(path, add_detokenizer=False)
    memo = load_processor(path, add_detokenizer=False)
    counted = Counted(memo.image_processor)
    memo.image_processor = ProcessorMemo(counted)
    return request.param, plain, memo, counted


def run(processor, family: str, images: list) -> dict:
    marker = {"gemma3": "<start_of_image>", "mistral3": "[IMG]"}[family]
    text = "".join(f"{marker} look {i}. " for i in range(len(images)))
    out = prepare_inputs(processor, images=images, prompts=text, return_tensors="np")
    return {k: np.asarray(v) for k, v in out.items() if v is not None}


def test_each_turn_gives_what_the_processor_gives_and_resizes_only_new_images(processors):
    family, plain, memo, counted = processors
    a, b, c = picture(1), picture(2), picture(3, size=(90, 120))
    for turn in ([a], [a, b], [a, b, c], [c, a]):
        got, want = run(memo, family, turn), run(plain, family, turn)
        assert got.keys() == want.keys()
        for key in want:
            assert np.array_equal(got[key], want[key]), (family, key, len(turn))
    # Each image resized once (both families' outputs are one entry per image here), where
    # the processor alone would have taken 1 + 2 + 3 + 2.
    assert counted.images == 3 and memo.image_processor.hits == 5


def test_the_memo_holds_at_most_its_bound_as_the_worker_calls_it(processors):
    """Through mlx-vlm's prepare_inputs, as the worker renders a prompt (the processor then
    gets lists of arrays back, not one stacked array)."""
    family, _plain, memo, _counted = processors
    inner = memo.image_processor._inner
    probe = ProcessorMemo(inner)
    memo.image_processor = probe
    run(memo, family, [picture(8)])
    one = probe.held
    assert one > 0 and len(probe) == 1
    memo.image_processor = small = ProcessorMemo(inner, max_bytes=2 * one)
    for seed in (9, 10, 11):
        run(memo, family, [picture(seed)])
    assert len(small) == 2 and small.held == 2 * one
    memo.image_processor = tiny = ProcessorMemo(inner, max_bytes=one - 1)
    run(memo, family, [picture(12)])
    assert len(tiny) == 0 and tiny.held == 0


def test_what_it_returns_is_a_copy_and_the_processor_still_serializes(processors):
    family, plain, memo, counted = processors
    memo.image_processor = ProcessorMemo(counted.inner)  # the processor itself underneath
    images = memo.image_processor  # called as the family's processor calls it
    first = images([[picture(20)]])
    for arr in first["pixel_values"]:  # a caller writing into what it got
        arr[...] = 0
    again, want = images([[picture(20)]]), plain.image_processor([[picture(20)]])
    assert images.hits == 1
    assert all(np.array_equal(a, b) for a, b in zip(again["pixel_values"], want["pixel_values"]))
    # transformers' to_dict / save_pretrained deep-copy the processor; repr uses to_dict.
    assert repr(memo) and memo.to_dict().keys() == plain.to_dict().keys()
    assert type(copy.deepcopy(memo.image_processor)) is type(plain.image_processor)
    assert type(pickle.loads(pickle.dumps(memo.image_processor))) is type(plain.image_processor)


def test_outputs_that_are_not_one_entry_per_image_go_to_the_processor_whole():
    """A processor that crops (two entries for one image) or returns what does not stack."""

    class Crops:
        calls: list[int] = []

        def __call__(self, images, **kwargs):
            self.calls.append(len(images))
            n = 2 * len(images)  # two crops per image
            return {"pixel_values": np.zeros((n, 3, 4, 4), np.float32), "num_crops": [2] * n}

    inner = Crops()
    memo = ProcessorMemo(inner)
    out = memo([picture(1), picture(2)])
    assert out["pixel_values"].shape[0] == 4 and len(memo) == 0
    assert inner.calls == [1, 2]  # tried the first alone, then the whole list
    memo([picture(1), picture(2)])
    assert inner.calls == [1, 2, 2]  # known to crop: the whole list at once, no second try
