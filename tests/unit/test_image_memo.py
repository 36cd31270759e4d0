"""A conversation's images are decoded once: the same bytes in a later turn come from the
worker's memo, with the checks' answer unchanged (a bad image is refused every time, a
tighter pixel limit checks again), and the memo holds at most its byte bound."""

from __future__ import annotations

import asyncio
import io

import pytest
from PIL import Image

from mlxd.shared.chat_job import ChatJob
from mlxd.shared.errors import BadRequest
from mlxd.shared.images import ImageInput, ImageLimits
from mlxd.shared.params import GenerationParams
from mlxd.worker.chat import image_memo
from mlxd.worker.chat.image_memo import DecodedImages
from mlxd.worker.chat.images import resolve_images

LIMITS = ImageLimits()


def png(color, size=(40, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def decodes(monkeypatch):
    """How many times the real check ran."""
    calls = []
    real = image_memo.check_image

    def counted(data, limits, param="image", **kw):
        calls.append(param)
        return real(data, limits, param, **kw)

    monkeypatch.setattr(image_memo, "check_image", counted)
    return calls


def job_with(*datas: bytes) -> ChatJob:
    images = [ImageInput(d, None, f"messages.{i}.content.0") for i, d in enumerate(datas)]
    return ChatJob(messages=[], params=GenerationParams(), images=images)


def test_a_later_turn_takes_the_same_image_from_the_memo_with_its_own_place(decodes):
    memo = DecodedImages()
    a, b = png((200, 10, 10)), png((10, 200, 10))
    turn1 = asyncio.run(resolve_images(job_with(a), LIMITS, memo=memo))
    turn2 = asyncio.run(resolve_images(job_with(a, b), LIMITS, memo=memo))
    assert decodes == ["messages.0.content.0", "messages.1.content.0"]  # `a` decoded once
    assert memo.hits == 1
    assert turn2[0].sha256 == turn1[0].sha256
    assert turn2[0].image.tobytes() == turn1[0].image.tobytes()
    assert [c.param for c in turn2] == ["messages.0.content.0", "messages.1.content.0"]
    assert turn2[1].image.getpixel((0, 0)) == (10, 200, 10)


def test_a_bad_image_is_refused_every_time_and_never_kept(decodes):
    memo = DecodedImages()
    cut = png((1, 2, 3))[:-30]
    for _ in range(2):
        with pytest.raises(BadRequest, match="truncated or corrupt"):
            memo.check(cut, LIMITS, "img")
    assert len(decodes) == 2 and len(memo) == 0 and memo.held == 0


def test_a_tighter_pixel_limit_checks_again():
    memo = DecodedImages()
    data = png((5, 5, 5), size=(40, 30))
    memo.check(data, LIMITS)
    with pytest.raises(BadRequest, match="image_max_pixels"):
        memo.check(data, ImageLimits(max_pixels=1000))


def test_the_memo_holds_at_most_its_bound_least_recently_used_out_first(decodes):
    one = 40 * 30 * 4  # what Pillow holds for RGB
    memo = DecodedImages(max_bytes=2 * one)
    a, b, c = (png((i, 0, 0)) for i in (1, 2, 3))
    memo.check(a, LIMITS)
    memo.check(b, LIMITS)
    memo.check(a, LIMITS)  # a used last: b is the oldest now
    memo.check(c, LIMITS)
    assert memo.held == 2 * one and len(memo) == 2
    decodes.clear()
    memo.check(a, LIMITS)
    memo.check(c, LIMITS)
    assert decodes == []  # both still held
    memo.check(b, LIMITS)
    assert decodes == ["image"]  # b was the one let go


def test_an_image_larger_than_the_bound_is_checked_but_not_kept():
    memo = DecodedImages(max_bytes=100)
    img = memo.check(png((9, 9, 9)), LIMITS)
    assert (img.width, img.height) == (40, 30)
    assert len(memo) == 0 and memo.held == 0
