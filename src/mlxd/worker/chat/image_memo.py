"""Decoded images kept by their bytes' hash, so a conversation about a screenshot decodes it
once, not once per turn: every turn re-sends the whole history, each image in it included,
and a 1024² PNG of noise took 25 ms to decode and check on a 2-core x86 CPU (8 such
images: 0.2 s before the prompt reached the engine, at every turn).

Only images that passed `check_image` are kept (a bad one is checked, and refused, every
time), under the same limits, so a hit is the answer the check would give. Bounded by the
decoded pixels held (`MEMO_BYTES`), least recently used out first; the PIL images are only
read after the check (the processor resizes copies), so requests may share one.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import replace

from mlxd.shared.byte_lru import ByteLRU
from mlxd.shared.images import CheckedImage, ImageLimits, check_image

MEMO_BYTES = 128 * 1024 * 1024  # decoded RGB pixels held (about 20 1080p screenshots)


def pixel_bytes(img: CheckedImage) -> int:
    """What Pillow holds for a decoded RGB image: 4 bytes a pixel (it stores RGB as RGBX)."""
    return img.width * img.height * 4


class DecodedImages:
    """`check_image` with a memory of the images that passed it."""

    def __init__(self, max_bytes: int = MEMO_BYTES):
        self._lru = ByteLRU(max_bytes)
        self.hits = 0
        self._lock = threading.Lock()  # checks run in threads

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def held(self) -> int:
        return self._lru.bytes

    def check(self, data: bytes, limits: ImageLimits, param: str = "image") -> CheckedImage:
        """What `check_image(data, limits, param)` gives, from memory when these bytes passed
        it before under these limits."""
        if len(data) > limits.max_bytes:  # refused by the check before any hashing
            return check_image(data, limits, param)
        digest = hashlib.sha256(data).hexdigest()
        key = f"{digest}:{limits.max_pixels}"
        with self._lock:
            hit = self._lru.get(key)
            if hit is not None:
                self.hits += 1
                return replace(hit, param=param)
        checked = check_image(data, limits, param, sha256=digest)
        with self._lock:
            self._lru.put(key, checked, pixel_bytes(checked))
        return checked
