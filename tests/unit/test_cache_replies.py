"""Generated ids given back to the next turn (cache/replies.py): the splice over a toy
tokenizer whose ids decode by concatenation, the trie's neighbours, and the SSD sidecar."""

from __future__ import annotations

import numpy as np

from mlxd.worker.cache import format as cache_format
from mlxd.worker.cache.replies import Reply, Spliced, clip, splice
from mlxd.worker.cache.ssd import SsdStore
from mlxd.worker.cache.trie import TokenTrie

# A toy vocabulary: "ab" is one token, and so are "a" and "b"; 9 the end of a turn.
VOCAB = {1: "<s>", 2: "a", 3: "b", 4: "ab", 5: "c", 6: "\n", 7: "user", 8: "x", 9: "<e>"}
VOCAB |= {10: "\u00e9"[:1], 11: "\ufffd"}


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] for i in ids)


# Turn 1: prompt [1, 6] ("<s>\n"), the model wrote a, b, c then the end token.
TURN1 = Reply(2, (2, 3, 5, 9))
ENTRY = (1, 6, 2, 3, 5)  # what the cache keeps: the prompt and all but the last token
# Turn 2 as the template renders it: the reply's text tokenized again ("ab" merged).
RENDERED = [1, 6, 4, 5, 9, 6, 7, 8]


def test_a_reply_tokenized_again_gets_its_generated_ids_back():
    s = splice(RENDERED, ENTRY, [TURN1], decode, {"abc"})
    assert s.ids == [1, 6, 2, 3, 5, 9, 6, 7, 8]
    assert decode(s.ids) == decode(RENDERED)  # the model sees the same text
    assert s.replies == (Reply(2, (2, 3, 5)),)  # the end token was the template's own
    assert s.edits == ((2, 2, 3),)
    # Positions after the span move by the one token the splice added.
    assert [s.shift(p) for p in (0, 2, 4, 7)] == [0, 2, 5, 8]


def test_a_reply_written_to_its_token_limit_is_spliced_whole():
    reply = Reply(2, (2, 3, 5))  # no end token: the client's text is all of it
    s = splice([1, 6, 4, 5, 9, 6], ENTRY, [reply], decode, {"abc"})
    assert s.ids == [1, 6, 2, 3, 5, 9, 6] and s.replies == (reply,)


def test_an_edited_reply_keeps_the_normal_tokenization():
    edited = [1, 6, 4, 8, 9, 6, 7]  # the client changed "abc" to "abx"
    for texts in ({"abx"}, {"abx", "abc"}):  # the generated text elsewhere changes nothing
        s = splice(edited, ENTRY, [TURN1], decode, texts)
        assert s.ids == edited and s.replies == () and s.edits == ()


def test_a_prompt_that_left_the_entry_before_the_reply_is_left_alone():
    other = [1, 8, 4, 5, 9]  # differs before the reply starts
    assert splice(other, ENTRY, [TURN1], decode, {"abc"}).ids == other


def test_text_that_does_not_round_trip_is_never_spliced():
    entry = (1, 6, 10, 5)
    s = splice([1, 6, 11, 5, 9], entry, [Reply(2, (10, 5, 9))], decode, {"\ufffdc"})
    assert s.ids == [1, 6, 11, 5, 9] and not s.edits


def test_a_span_ending_inside_a_token_is_not_spliced():
    # The prompt holds "abcx" as "ab", "cx": no run of whole tokens holds exactly "abc".
    vocab_decode = {**VOCAB, 12: "cx"}
    s = splice(
        [1, 6, 4, 12, 9],
        ENTRY,
        [TURN1],
        lambda ids: "".join(vocab_decode[i] for i in ids),
        {"abc"},
    )
    assert s.ids == [1, 6, 4, 12, 9] and not s.edits


def test_earlier_replies_already_in_place_are_carried_and_later_ones_spliced():
    # Turn 3: turn 1's reply is already the generated ids (turn 2 spliced it), turn 2's
    # reply ("ab" generated as a, b) comes back as the one token "ab".
    turn2 = Reply(9, (2, 3, 9))
    entry = (1, 6, 2, 3, 5, 9, 6, 7, 6, 2, 3)
    rendered = [1, 6, 4, 5, 9, 6, 7, 6, 4, 9, 6, 7, 8]  # both replies tokenized again
    first = splice(rendered, entry, [Reply(2, (2, 3, 5)), turn2], decode, {"abc", "ab"})
    assert first.ids == [1, 6, 2, 3, 5, 9, 6, 7, 6, 2, 3, 9, 6, 7, 8]
    assert first.replies == (Reply(2, (2, 3, 5)), Reply(9, (2, 3)))
    assert decode(first.ids) == decode(rendered)
    # A prompt that already holds the generated ids keeps them, and says so.
    again = splice(first.ids, entry, [Reply(2, (2, 3, 5)), Reply(9, (2, 3))], decode, set())
    assert again.ids == first.ids and again.replies == first.replies and not again.edits


def test_clip_keeps_the_replies_an_entry_holds():
    replies = (Reply(2, (1, 2)), Reply(9, (3,)))
    assert clip(replies, 9) == (Reply(2, (1, 2)),)
    assert Spliced([1]).shift(5) == 5


def test_the_trie_finds_the_entries_around_a_prompt():
    trie: TokenTrie[str] = TokenTrie()
    trie.insert((1, 2), "prefix")
    trie.insert((1, 2, 3, 4), "longer")
    trie.insert((1, 2, 3, 5), "other")
    trie.insert((7, 8), "unrelated")
    near = trie.around([1, 2, 3, 9], limit=4)
    assert near[0] == "prefix" and set(near[1:]) == {"longer", "other"}
    assert len(trie.around([1, 2, 3, 9], limit=2)) == 2
    assert trie.around([1, 2, 3, 9], 4, want=lambda v: v != "prefix")[0] != "prefix"
    assert trie.around([9], limit=4) == []  # nothing shared: nothing is near
    # An entry that left the prompt's path earlier is found too, after the deeper ones (the
    # prompt shares more with an edited turn than with the reply the cache remembers).
    trie.insert((1, 6, 6), "early")
    assert trie.around([1, 2, 3, 4, 0], limit=4, want=lambda v: v != "prefix") == [
        "longer",
        "other",
        "early",
    ]


def test_replies_travel_with_an_ssd_entry_and_bad_ones_are_dropped(tmp_path):
    arrays = {
        "0.k": np.zeros((1, 1, 3, 4), dtype=np.float32),
        "0.v": np.zeros((1, 1, 3, 4), dtype=np.float32),
    }
    store = SsdStore(tmp_path / "fp", cap_bytes=1 << 20)
    store.scan()
    assert store.write("", (1, 2, 3), arrays, {}, None, replies=(Reply(1, (2, 3, 4)),))
    assert store.write("", (5, 6, 7), arrays, {}, None)
    again = SsdStore(tmp_path / "fp", cap_bytes=1 << 20)
    assert again.scan() == 2
    [e] = again.near("", [1, 2, 9], 4)  # the entry without replies is not offered
    assert e.replies == (Reply(1, (2, 3, 4)),)
    # A sidecar whose replies do not add up keeps its entry, without replies.
    meta = {"ns": "", "tokens": [1, 2, 3], "file_bytes": 5, "sha256": "x"}
    key = cache_format.entry_key("", (1, 2, 3))
    for bad in ([[7, [1]]], [["1", [1]]], [[1, [-1]]], "no"):
        e = cache_format.entry_from_meta(key, {**meta, "replies": bad}, 5, 0.0)
        assert e.replies == () and e.tokens == (1, 2, 3)
