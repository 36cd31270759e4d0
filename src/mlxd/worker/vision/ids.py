"""Each image's prompt tokens as ids of its own content, for the prompt cache and the engine.

A processor writes one image token id per image feature, the same id for every image, so two
conversations about different screenshots would share a cached prefix that is wrong for one
of them. Each image's tokens are rewritten here to ids past every vocabulary (`BASE` and up)
drawn from the image's content hash: four 30-bit words of its SHA-256, the j-th token taking
word j mod 4, so a prefix match that runs into an image runs through it only when the image
is the same one (120 bits; a different image diverges at its first token, almost always).
The engine knows an image position by its id alone (`id >= BASE`), which is how the prompt
cache, its SSD tier, preemption and chunked prefill carry images without knowing of them.
Pure (no MLX).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BASE = 1 << 30  # above every vocabulary; below 2**31 so ids stay int32
_WORDS = 4


def words_of(sha256_hex: str) -> tuple[int, ...]:
    """The ids an image's tokens cycle through, from its SHA-256 (hex)."""
    raw = int(sha256_hex[: _WORDS * 8], 16)
    return tuple(BASE + ((raw >> (32 * i)) & ((1 << 30) - 1)) for i in range(_WORDS))


def image_runs(ids: Sequence[int], image_id: int, inside: frozenset[int] = frozenset()) -> list:
    """Each image's token positions (a list of position lists, in prompt order): maximal runs
    of `image_id` and the family's in-image separators (`inside`, e.g. Pixtral's row break)
    holding at least one image token. Only the image-token positions are listed."""
    runs: list[list[int]] = []
    current: list[int] | None = None
    for p, t in enumerate(ids):
        if t == image_id:
            if current is None:
                current = []
                runs.append(current)
            current.append(p)
        elif t not in inside:
            current = None
    return runs


def content_ids(
    ids: Sequence[int], image_id: int, hashes: Sequence[str], inside: frozenset[int] = frozenset()
) -> list[int]:
    """`ids` with each image's tokens replaced by its content ids (`hashes`: one per image,
    in order). ValueError when the prompt holds another number of images than `hashes`
    (e.g. the text itself spelled the model's image marker)."""
    runs = image_runs(ids, image_id, inside)
    if len(runs) != len(hashes):
        raise ValueError(f"the prompt holds {len(runs)} image(s) for {len(hashes)} sent")
    out = list(ids)
    for run, h in zip(runs, hashes, strict=True):
        w = words_of(h)
        for j, p in enumerate(run):
            out[p] = w[j % _WORDS]
    return out


def image_positions(ids: Sequence[int]) -> np.ndarray:
    """Positions of image tokens (content ids) in a prompt, ascending."""
    arr = np.asarray(ids, dtype=np.int64)
    return np.nonzero(arr >= BASE)[0]
