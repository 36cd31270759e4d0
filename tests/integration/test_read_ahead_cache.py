"""What the SSD read-ahead does to the two tiers (worker/cache/read_ahead.py, PromptCache.warm):
real MLX arrays, a real store and writer, a restart in between; no timing."""

from __future__ import annotations

import pytest
from kv_layers import LAYOUT, layers, window_layers

from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.cache.read_ahead import pick


def tokens(i: int, n: int = 300) -> tuple[int, ...]:
    return tuple(10_000 * (i + 1) + j for j in range(n))


@pytest.fixture
def restarted(tmp_path):
    """Three conversations written to the SSD tier (0 oldest), then a fresh cache on the
    same folder: what a worker that comes back finds."""
    made = []

    def make(ram_bytes: int = 1 << 26) -> PromptCache:
        c = PromptCache(ram_bytes, tmp_path / "fp", 1 << 30, layout=LAYOUT, quiet_s=0)
        c.start()
        made.append(c)
        return c

    first = make()
    for i in range(3):
        first.store("", tokens(i), layers(300, i), session=f"s{i}")
        first.writes.persist_all()
        assert first.writes.flush(30)
    yield make
    for c in made:
        assert c.writes.flush(30)


def used_in_order(cache: PromptCache) -> None:
    """Conversation i was used i-th (0 oldest), whatever the files' times say."""
    for e in cache.ssd.index.entries():
        e.last_used = 1000.0 + e.tokens[0] // 10_000


def warm_all(cache: PromptCache) -> list[bool]:
    used_in_order(cache)
    chosen = pick(cache.ssd.index.entries(), cache.ram.cap_bytes - cache.ram.nbytes)
    return [cache.warm(e, cache.read_ssd(e, use=False)) for e in chosen]


def test_read_ahead_fills_ram_newest_first_and_a_request_then_hits_ram(restarted):
    cache = restarted()
    assert len(cache.ssd) == 3 and len(cache.ram) == 0  # scanned at start, RAM empty
    assert warm_all(cache) == [True, True, True]
    # Guesses are not uses: no restore counted, no recency renewed.
    assert cache.stats()["cache_ssd_restores"] == 0
    assert sorted(e.last_used for e in cache.ssd.index.entries()) == [1001.0, 1002.0, 1003.0]
    assert len(cache.ram) == 3
    prompt = list(tokens(2)) + [7, 8, 9]  # the newest conversation's next turn
    got, n, where = cache.fetch("", prompt)
    assert where == "ram" and n >= 299 and got is not None
    assert cache.ssd_candidate("", prompt) is None  # nothing left to restore for it


def test_an_entry_ram_already_holds_or_extends_is_not_read_in_again(restarted):
    cache = restarted()
    e2, _ = cache.ssd.best("", list(tokens(2)))
    cache.store("", tokens(2) + (5, 6), layers(302, 9))  # a request went on from entry 2
    assert cache.ram.covers("", e2.tokens)
    assert cache.warm(e2, cache.read_ssd(e2, use=False)) is False
    e1, _ = cache.ssd.best("", list(tokens(1)))
    assert not cache.ram.covers("", e1.tokens)
    assert cache.warm(e1, cache.read_ssd(e1, use=False)) is True
    assert cache.ram.covers("", e1.tokens)
    assert cache.warm(e1, cache.read_ssd(e1, use=False)) is False  # exact: held already


def test_a_windowed_snapshot_is_not_covered_by_the_longer_turn_after_it(restarted):
    """A sliding-window (or hybrid) model keeps a snapshot at the prompt's length beside the
    entry of the whole turn: the longer one cannot be cut back, so the snapshot is read ahead
    too (gemma3-12b's resend after a reload was restored from the SSD, 2026-12-07)."""
    cache = restarted()
    e2, _ = cache.ssd.best("", list(tokens(2)))
    cache.store("", tokens(2) + (5, 6), window_layers(302, 64, 9))  # the turn went on
    assert not cache.ram.covers("", e2.tokens)
    assert cache.warm(e2, cache.read_ssd(e2, use=False)) is True
    assert cache.ram.covers("", e2.tokens)
    # The same turn in caches that can be cut back (a window not yet full) does cover it.
    e1, _ = cache.ssd.best("", list(tokens(1)))
    cache.store("", tokens(1) + (5, 6), window_layers(302, 512, 8))
    assert cache.ram.covers("", e1.tokens)


def test_guesses_are_evicted_before_what_requests_used_and_nothing_for_them(restarted):
    one = sum(c.nbytes for c in layers(300, 0))
    cache = restarted(ram_bytes=3 * one + one // 2)
    mine = tokens(7)
    cache.store("", mine, layers(300, 7))  # a request's entry, in RAM before the guesses
    assert warm_all(cache) == [True, True]  # room for two of the three, nothing evicted
    assert cache.ram.covers("", mine) and len(cache.ram) == 3
    cache.store("", tokens(8), layers(300, 8))  # a new request's entry needs room
    assert cache.ram.covers("", mine)  # the guesses went first, the request's entry stayed
    assert cache.ram.covers("", tokens(2))  # and of the guesses, the newest stayed
    assert not cache.ram.covers("", tokens(1))


def test_a_guess_a_request_used_is_kept_as_what_requests_use(restarted):
    one = sum(c.nbytes for c in layers(300, 0))
    cache = restarted(ram_bytes=3 * one + one // 2)
    assert warm_all(cache) == [True, True, True]
    got, _, where = cache.fetch("", list(tokens(0)) + [1, 2])  # the oldest guess, used
    assert where == "ram" and got is not None
    cache.store("", tokens(8), layers(300, 8), session="s8")  # needs one entry's room
    assert cache.ram.covers("", tokens(0))  # used: no longer a guess
    assert not cache.ram.covers("", tokens(1))  # the oldest guess still unused went
    assert cache.ram.covers("", tokens(2)) and cache.ram.covers("", tokens(8))


@pytest.mark.parametrize("copies", [False, True])
def test_an_entry_read_ahead_enters_ram_as_device_copies_where_asked(
    restarted, monkeypatch, copies
):
    """On CUDA (forced here) the read's managed memory, which the CPU filled, is copied by the
    device as the entry enters RAM: a request's first step then reads device memory. Elsewhere
    the caches hold the read's own memory (no copy)."""
    import numpy as np
    from kv_layers import address

    from mlxd.worker.cache import kv_arrays

    monkeypatch.setattr(kv_arrays, "DEVICE_COPIES", copies)
    cache = restarted()
    e = next(e for e in cache.ssd.index.entries() if e.session == "s1")
    arrays = cache.read_ssd(e, use=False)
    assert cache.warm(e, arrays)
    (entry,) = cache.ram.entries()
    keys = entry.layers[0].keys
    assert (address(keys) == arrays["0.k"].ctypes.data) is not copies
    expect = layers(300, 1)[0].keys
    assert np.array_equal(np.array(keys), np.array(expect))
