"""Stop strings across token boundaries and UTF-8-safe streaming."""

from __future__ import annotations

from mlx_lm import load

from mlxd.worker.engine.textstream import TextStream, make_detokenizer


def _stream(tokenizer, text: str, stops=()) -> tuple[list[str], TextStream]:
    ts = TextStream(make_detokenizer(tokenizer), tuple(stops))
    parts = [ts.push(t) for t in tokenizer.encode(text, add_special_tokens=False)]
    parts.append(ts.finish())
    return parts, ts


def test_streamed_text_equals_decode_and_never_splits_a_character(tiny_model_dir):
    _, tok = load(str(tiny_model_dir))
    text = " café 😀 naïve — 東京 done"
    parts, _ = _stream(tok, text)
    assert "".join(parts) == text
    assert all("\ufffd" not in p for p in parts)


def test_stop_string_spanning_tokens(tiny_model_dir):
    _, tok = load(str(tiny_model_dir))
    parts, ts = _stream(tok, "the quick brown fox jumps", stops=["wn fo", "zzz"])
    assert "".join(parts) == "the quick bro"
    assert ts.stopped


def test_held_back_prefix_is_released_when_it_is_not_a_stop(tiny_model_dir):
    _, tok = load(str(tiny_model_dir))
    parts, ts = _stream(tok, "the quick brown", stops=["brownie"])
    assert "".join(parts) == "the quick brown"
    assert not ts.stopped
