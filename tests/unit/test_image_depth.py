"""Images of more than 8 bits a sample reach the model as the picture they are: a 16-bit
grayscale PNG (scans, depth maps, scientific plots) is scaled to 8 bits, not clipped (Pillow's
own conversion to RGB clips every value above 255 to white), and a transparent one is put on
white as the models' processors do, not shown with the colour hidden under its alpha."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from mlxd.shared.images import ImageLimits, check_image

RAMP = (np.arange(16 * 64).reshape(16, 64) * 64).astype(np.uint16)  # 0 .. 65472


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def test_a_16_bit_grayscale_png_is_scaled_to_8_bits_not_clipped():
    data = png_bytes(Image.fromarray(RAMP))
    assert Image.open(io.BytesIO(data)).mode.startswith("I")  # 16 bits in the file
    rgb = np.asarray(check_image(data, ImageLimits()).image)
    want = (RAMP.astype(np.int64) * 255 // 65535).astype(np.uint8)
    assert rgb.shape == (*RAMP.shape, 3)
    assert np.abs(rgb[..., 0].astype(int) - want).max() <= 1
    assert (rgb[..., 0] == 255).mean() < 0.01  # not a white picture


def test_an_8_bit_grayscale_png_is_unchanged():
    gray = np.arange(256, dtype=np.uint8).reshape(16, 16)
    rgb = np.asarray(check_image(png_bytes(Image.fromarray(gray)), ImageLimits()).image)
    assert (rgb[..., 0] == gray).all()


def transparent_drawing(mode: str) -> Image.Image:
    """Black strokes on a fully transparent background whose hidden colour is black too (what
    most drawing tools write): a logo, an icon, a diagram exported with transparency."""
    rgba = np.zeros((16, 16, 4), dtype=np.uint8)
    rgba[4:12, 7:9, 3] = 255  # an opaque black bar; everything else alpha 0
    img = Image.fromarray(rgba, "RGBA")
    return img if mode == "RGBA" else img.convert(mode)


@pytest.mark.parametrize("mode", ["RGBA", "LA"])
def test_transparency_is_composited_on_white_as_the_models_processors_do(mode):
    """transformers' processors (`convert_to_rgb`) and Ollama put a transparent image on
    white; dropping the alpha channel instead shows the hidden colour, here black on black:
    the model would see an empty picture."""
    rgb = np.asarray(check_image(png_bytes(transparent_drawing(mode)), ImageLimits()).image)
    assert (rgb[0, 0] == 255).all()  # the background: white
    assert (rgb[8, 8] == 0).all()  # the bar: black


def test_a_palette_png_with_a_transparent_index_is_composited_on_white():
    pal = Image.new("P", (8, 8), 0)
    pal.putpalette([0, 0, 0, 200, 30, 60] + [0] * 762)
    pal.paste(1, (2, 2, 6, 6))
    buf = io.BytesIO()
    pal.save(buf, format="PNG", transparency=0)
    rgb = np.asarray(check_image(buf.getvalue(), ImageLimits()).image)
    assert (rgb[0, 0] == 255).all() and tuple(rgb[3, 3]) == (200, 30, 60)
