"""A conversation's images are resized once: the family's image processor answers an image it
has seen from memory, and what it returns is what the processor itself returns for the whole
list, for both VLM families."""

from __future__ import annotations

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


def test_the_memo_holds_at_most_its_bound(processors):
    family, _plain, memo, _counted = processors
    if family != "gemma3":
        pytest.skip("only one-entry-per-image outputs are kept")
    inner = memo.image_processor._inner
    one = ProcessorMemo(inner, max_bytes=1)  # smaller than any image's pixels
    one([picture(7)], return_tensors="np")
    assert len(one) == 0 and one.held == 0
    size = ProcessorMemo(inner)
    size([picture(8)], return_tensors="np")
    two = ProcessorMemo(inner, max_bytes=2 * size.held)
    for seed in (9, 10, 11):
        two([picture(seed)], return_tensors="np")
    assert len(two) == 2 and two.held == 2 * size.held


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
