"""Each image's prompt tokens as ids of its content (worker/vision/ids.py): the same image
gives the same ids wherever it is, another image diverges at its first token, every id is
past the vocabulary and fits int32, and a prompt whose marker count is off is refused."""

from __future__ import annotations

import hashlib

import pytest

from mlxd.worker.vision.ids import BASE, content_ids, image_positions, image_runs, words_of

IMG, BREAK, END = 9, 8, 7


def h(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def test_runs_split_at_anything_but_image_tokens_and_in_image_separators():
    ids = [1, IMG, IMG, BREAK, IMG, END, IMG, 2, IMG, IMG]
    assert image_runs(ids, IMG, frozenset({BREAK})) == [[1, 2, 4], [6], [8, 9]]
    assert image_runs(ids, IMG) == [[1, 2], [4], [6], [8, 9]]


def test_content_ids_follow_the_image_not_its_place():
    a, b = h("a"), h("b")
    one = content_ids([1, IMG, IMG, IMG, IMG, IMG, 2], IMG, [a])
    later = content_ids([5, 5, 5, 1, IMG, IMG, IMG, IMG, IMG, 2], IMG, [a])
    assert one[1:6] == later[4:9]  # the same image, wherever it sits
    other = content_ids([1, IMG, IMG, IMG, IMG, IMG, 2], IMG, [b])
    assert other[0] == one[0] and other[1] != one[1]  # another image diverges at once
    assert one[1:6] == [words_of(a)[j % 4] for j in range(5)]
    assert all(BASE <= t < 2**31 for t in one[1:6]) and one[0] == 1 and one[6] == 2
    assert list(image_positions(one)) == [1, 2, 3, 4, 5]


def test_two_images_in_one_prompt_keep_their_order():
    a, b = h("a"), h("b")
    ids = content_ids([IMG, IMG, END, IMG, IMG], IMG, [a, b])
    assert ids[:2] == list(words_of(a)[:2]) and ids[3:] == list(words_of(b)[:2])


def test_a_marker_count_other_than_the_images_sent_is_refused():
    with pytest.raises(ValueError, match="2 image"):
        content_ids([IMG, 3, IMG], IMG, [h("a")])
