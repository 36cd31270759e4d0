"""A family's image processor with a memory: each image's pixels (resized, normalized) kept by
the image's content, so a conversation about a screenshot resizes it once, not at every turn
(every turn re-sends the whole history, and the processor runs over all of it again: ~45 ms
per 1024² image at Gemma 3's 896 px on a 2-core x86 CPU, the largest cost of a cached turn 2
beside the transport, docs/benchmarks.md, Images).

It wraps the processor's `image_processor` (what transformers' processors call with the
prompt's images) and answers a call image by image: an image seen before from memory, a new one
by the real processor alone. That is exact only where the processor treats images
independently and each image is one entry of every output (Gemma 3: `pixel_values` [n, 3, H,
W] and `num_crops` [n]); anything else (a crop count per image, sizes that need padding to a
batch, a nesting it does not know) goes to the real processor whole, as before. Bounded by the
bytes it holds (`MEMO_BYTES`), least recently used out first.
"""

from __future__ import annotations

import copy
import hashlib
import threading
from typing import Any

import numpy as np

from mlxd.shared.byte_lru import ByteLRU

MEMO_BYTES = 256 * 1024 * 1024  # processed pixels held (float32: ~9.6 MB per 896² image)


def _content_key(img: Any) -> str | None:
    """A PIL image's pixels, mode and size as a key (None: not a PIL image)."""
    tobytes = getattr(img, "tobytes", None)
    if tobytes is None or not hasattr(img, "mode") or not hasattr(img, "size"):
        return None
    digest = hashlib.blake2b(tobytes(), digest_size=16).hexdigest()
    return f"{img.mode}:{img.size[0]}x{img.size[1]}:{digest}"


def _one_each(out: Any) -> bool:
    """Whether every output is one entry for the one image it was given."""
    items = getattr(out, "items", None)
    if items is None:
        return False
    for _, value in items():
        if isinstance(value, np.ndarray):
            if value.ndim == 0 or value.shape[0] != 1:
                return False
        elif not (isinstance(value, list) and len(value) == 1):
            return False
    return True


def _join(parts: list[Any]) -> Any:
    """The outputs of images one by one as one output of them all (ValueError: they do not
    stack, e.g. different sizes)."""
    first = parts[0]
    data: dict[str, Any] = {}
    for key, value in first.items():
        values = [p[key] for p in parts]
        if isinstance(value, np.ndarray):
            data[key] = np.concatenate(values, axis=0)
        else:  # copies: the memory's arrays never leave it
            data[key] = [np.array(x) if isinstance(x, np.ndarray) else x for v in values for x in v]
    return type(first)(data)


def _nbytes(out: Any) -> int:
    """The bytes of an output's arrays, whole or in lists (transformers 5's processors give
    `pixel_values` as a list of arrays when no tensor type is asked for)."""
    arrays = (a for _, v in out.items() for a in (v if isinstance(v, list) else [v]))
    return sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))


def _unwrapped(inner: Any) -> Any:
    return inner


class ProcessorMemo:
    """`inner` (an image processor) answering from memory for images it has seen."""

    def __init__(self, inner: Any, max_bytes: int = MEMO_BYTES):
        self._inner = inner
        self._lru = ByteLRU(max_bytes)
        self.hits = 0
        self._whole: set[str] = set()  # images whose output is not one entry (crops)
        self._lock = threading.Lock()  # prompts are processed in threads

    def __getattr__(self, name: str) -> Any:  # size, resample, ...: the processor's own
        if name.startswith("__") or name == "_inner":  # copies and reprs before __init__
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"ProcessorMemo({self._inner!r})"

    # A processor's to_dict / save_pretrained deep-copy it, and pickling copies it: those see
    # the processor itself (the memory and its lock stay behind).
    def __deepcopy__(self, memo: dict) -> Any:
        return copy.deepcopy(self._inner, memo)

    def __reduce__(self) -> tuple:
        return (_unwrapped, (self._inner,))

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def held(self) -> int:
        return self._lru.bytes

    def __call__(self, images: Any, **kwargs: Any) -> Any:
        nested = isinstance(images, list) and len(images) == 1 and isinstance(images[0], list)
        flat = images[0] if nested else images
        keys = [_content_key(img) for img in flat] if isinstance(flat, list) and flat else []
        if not keys or any(k is None for k in keys):
            return self._inner(images, **kwargs)
        settings = repr(sorted(kwargs.items()))
        if any(f"{key}|{settings}" in self._whole for key in keys):
            return self._inner(images, **kwargs)
        parts = []
        for img, key in zip(flat, keys, strict=True):
            full = f"{key}|{settings}"
            with self._lock:
                hit = self._lru.get(full)
                if hit is not None:
                    self.hits += 1
            if hit is None:
                hit = self._inner([[img]] if nested else [img], **kwargs)
                if not _one_each(hit):
                    with self._lock:
                        if len(self._whole) > 4096:  # a bound: forget, ask again
                            self._whole.clear()
                        self._whole.add(full)
                    return self._inner(images, **kwargs)
                self._keep(full, hit)
            parts.append(hit)
        try:
            return _join(parts)
        except ValueError:  # sizes that need the batch's padding: the processor's own way
            return self._inner(images, **kwargs)

    def _keep(self, key: str, out: Any) -> None:
        with self._lock:  # a twin kept meanwhile by another thread is replaced: same pixels
            self._lru.put(key, out, _nbytes(out))
