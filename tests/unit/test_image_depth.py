"""Images of more than 8 bits a sample reach the model as the picture they are: a 16-bit
grayscale PNG (scans, depth maps, scientific plots) is scaled to 8 bits, not clipped (Pillow's
own conversion to RGB clips every value above 255 to white)."""

from __future__ import annotations

import io

import numpy as np
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
