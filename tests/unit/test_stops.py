"""The one stop-string scanner (engine rows and the chat driver): cuts, held tails, matches."""

from __future__ import annotations

import pytest

from mlxd.worker.engine.stops import StopScanner, held_tail_len


def chunks(text: str, n: int) -> list[str]:
    return [text[i : i + n] for i in range(0, len(text), n)]


def run(stops: tuple[str, ...], text: str, n: int) -> tuple[str, StopScanner]:
    s = StopScanner(stops)
    return "".join(s.feed(c) for c in chunks(text, n)) + s.finish(), s


@pytest.mark.parametrize("n", [1, 2, 5])
def test_stop_scanner_cuts_across_deltas_and_names_the_match(n):
    s = StopScanner(("STOP", "END"))
    out = "".join(s.feed(c) for c in chunks("abc STEP xyz ENDING", n)) + s.finish()
    assert out == "abc STEP xyz "
    assert s.matched == "END"


def test_stop_scanner_releases_a_false_start_at_the_end():
    s = StopScanner(("STOP",))
    assert s.feed("abc ST") == "abc "
    assert s.finish() == "ST" and s.matched is None


@pytest.mark.parametrize("n", [1, 3, 100])
def test_the_earliest_match_wins_whatever_the_order_of_the_stops(n):
    out, s = run(("later", "early"), "an early and a later end", n)
    assert out == "an " and s.matched == "early"


def test_a_tie_at_one_position_goes_to_the_string_that_sorts_first():
    out, s = run(("abc", "ab"), "xx abc", 100)
    assert out == "xx " and s.matched == "ab"


def test_without_stops_text_passes_through_untouched():
    s = StopScanner(())
    assert s.feed("ST") == "ST" and s.feed("OP") == "OP"
    assert s.finish() == "" and s.matched is None


def test_nothing_comes_out_after_a_match():
    s = StopScanner(("STOP",))
    assert s.feed("a STOP b") == "a "
    assert s.feed("more") == "" and s.finish() == ""


def test_a_held_tail_is_released_as_soon_as_it_cannot_be_a_stop():
    s = StopScanner(("<|end|>",))
    assert s.feed("x <|e") == "x "
    assert s.feed("x") == "<|ex"
    assert s.finish() == ""


def test_multibyte_text_is_cut_between_characters():
    out, s = run(("東京",), "café 😀 東京 done", 1)
    assert out == "café 😀 " and s.matched == "東京"


def test_held_tail_len_is_the_longest_proper_prefix_at_the_end():
    assert held_tail_len("abc <thi", ["<think>", "<tool_call>"]) == 4
    assert held_tail_len("abc <", ["<think>", "<tool_call>"]) == 1
    assert held_tail_len("abc", ["<think>"]) == 0
    assert held_tail_len("<think>", ["<think>"]) == 0  # a whole match is not a held tail
    assert held_tail_len("", ["<think>"]) == 0
