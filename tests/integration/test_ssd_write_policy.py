"""The SSD tier writes only what earns it (issue 14): a session's entries and entries reused
for real (a prefix of at least EARN_TOKENS) before any drain; unique prompts never, not even
when RAM evicts them; drain, flush and shutdown (persist_all) write everything. Real MLX arrays,
a real store and writer, a fake clock for the quiet period: no timing."""

from __future__ import annotations

import time

import pytest
from kv_layers import LAYOUT, address, layers

from mlxd.worker.cache.prompt_cache import PromptCache
from mlxd.worker.cache.ram import EARN_TOKENS

TEMPLATE = tuple(range(1000, 1010))  # what every chat prompt starts with: ~10 tokens


def prompt(i: int, n: int = 300) -> tuple[int, ...]:
    """A unique prompt: the shared template, then tokens no other prompt has."""
    return TEMPLATE + tuple(10_000 * (i + 1) + j for j in range(n - len(TEMPLATE)))


def entry_bytes(n: int) -> int:
    return sum(c.nbytes for c in layers(n))


@pytest.fixture
def make_cache(tmp_path):
    made = []

    def make(ram_bytes: int = 1 << 26, **kw) -> PromptCache:
        c = PromptCache(ram_bytes, tmp_path / "fp", 1 << 30, layout=LAYOUT, quiet_s=0, **kw)
        c.start()
        made.append(c)
        return c

    yield make
    for c in made:
        assert c.writes.flush(30)


def settle(cache: PromptCache) -> dict:
    """Write-behind well after the quiet period, then wait for the writer: the stats."""
    cache.writes.maintain(time.monotonic() + 3600)
    assert cache.writes.flush(30)
    return cache.stats()


def files(cache: PromptCache) -> list:
    return sorted(p for p in cache.ssd.dir.iterdir() if p.is_file())


def store(cache: PromptCache, tokens: tuple[int, ...], session=None, cached=0, seed=0) -> None:
    cache.store("", tokens, layers(len(tokens), seed), session, cached=cached)


def test_unique_prompts_are_not_written_after_their_quiet_time(make_cache):
    cache = make_cache()
    for i in range(6):
        p = prompt(i)
        # Each request meets the template prefix of the one before: a hit, not a reuse.
        layers_, n, _ = cache.fetch("", list(p))
        assert n < EARN_TOKENS
        store(cache, p, cached=n, seed=i)
    s = settle(cache)
    assert s["cache_ssd_writes"] == 0 and s["cache_ssd_written_bytes"] == 0
    assert files(cache) == [] and cache.writes.tally() == (0, 0)
    assert s["cache_ram_entries"] == 6


def test_session_entries_are_written_after_their_quiet_time(make_cache):
    cache = make_cache()
    store(cache, prompt(0), session="s-1")
    store(cache, prompt(1))
    s = settle(cache)
    assert s["cache_ssd_writes"] == 1 and s["cache_ssd_written_session"] == 1
    assert s["cache_ssd_written_reused"] == s["cache_ssd_written_drain"] == 0
    assert len(cache.ssd) == 1 and cache.ssd.best("", list(prompt(0)))[0].session == "s-1"


def test_a_real_reuse_earns_both_entries_their_write(make_cache):
    cache = make_cache()
    first = prompt(0)
    store(cache, first)
    # A second request sharing 280 tokens of the first (a system prompt, a resent document).
    second = first[:280] + tuple(range(7, 47))
    _, n, source = cache.fetch("", list(second))
    assert (n, source) == (280, "ram")
    store(cache, second, cached=n, seed=1)
    s = settle(cache)
    assert s["cache_ssd_writes"] == 2 and s["cache_ssd_written_reused"] == 2
    assert cache.ssd.best("", list(first))[1] == len(first) - 1
    assert cache.ssd.best("", list(second))[1] == len(second) - 1


def test_the_next_turn_inherits_the_hit_of_the_turn_it_extends(make_cache):
    cache = make_cache()
    turn1 = prompt(0)
    store(cache, turn1)
    turn2 = turn1 + tuple(range(5, 45))
    _, n, _ = cache.fetch("", list(turn2))
    assert n == len(turn1)
    # Stored without a reuse of its own (as if the row had not said): the turn it replaces had
    # one, and that is carried over.
    store(cache, turn2, seed=1)
    assert cache.stats()["cache_ram_entries"] == 1  # turn 1 is covered by turn 2
    s = settle(cache)
    assert s["cache_ssd_writes"] == 1 and s["cache_ssd_written_reused"] == 1
    assert cache.ssd.best("", list(turn2) + [1])[1] == len(turn2)


def test_an_unearned_entry_evicted_from_ram_is_dropped_not_spilled(make_cache):
    cache = make_cache(ram_bytes=entry_bytes(300))  # room for one entry
    for i in range(4):
        store(cache, prompt(i), seed=i)
    s = settle(cache)
    assert s["cache_ram_evictions"] == 3 and s["cache_spills"] == 0
    assert s["cache_ssd_writes"] == 0 and files(cache) == []


def test_an_earned_entry_evicted_from_ram_is_spilled(make_cache):
    cache = make_cache(ram_bytes=entry_bytes(300))
    store(cache, prompt(0), session="s-1")
    store(cache, prompt(1), session="s-1", seed=1)  # evicts the first: it goes to the SSD
    assert cache.writes.flush(30)
    s = cache.stats()
    assert s["cache_ram_evictions"] == 1 and s["cache_spills"] == 1
    assert s["cache_ssd_writes"] == 1
    assert cache.ssd.best("", list(prompt(0)))[1] == 299


def test_an_entry_too_big_for_ram_goes_to_the_ssd_only_if_earned(make_cache):
    cache = make_cache(ram_bytes=entry_bytes(100))
    store(cache, prompt(0))
    assert cache.writes.flush(30) and cache.stats()["cache_ssd_writes"] == 0
    store(cache, prompt(1), cached=EARN_TOKENS, seed=1)
    store(cache, prompt(2), session="s-2", seed=2)
    assert cache.writes.flush(30)
    s = cache.stats()
    assert s["cache_ssd_writes"] == 2 and s["cache_ram_entries"] == 0
    assert s["cache_ssd_written_reused"] == s["cache_ssd_written_session"] == 1


def test_persist_all_writes_every_ram_entry_earned_or_not(make_cache):
    cache = make_cache()
    for i in range(3):
        store(cache, prompt(i), seed=i)
    store(cache, prompt(3), session="s-3", seed=3)
    assert cache.writes.persist_all() == 4
    assert cache.writes.flush(30)
    s = cache.stats()
    assert s["cache_ssd_writes"] == 4 and s["cache_ssd_entries"] == 4
    assert s["cache_ssd_written_drain"] == 3 and s["cache_ssd_written_session"] == 1
    assert cache.writes.persist_all() == 0  # nothing left to write
    for i in range(4):
        assert cache.ssd.best("", list(prompt(i)))[1] == 299


def test_bytes_written_are_the_bytes_of_the_files_written(make_cache):
    cache = make_cache()
    store(cache, prompt(0), session="s")
    store(cache, prompt(1, 500), seed=1)
    store(cache, prompt(2, 50), seed=2)
    s = settle(cache)
    assert s["cache_ssd_writes"] == 1
    assert s["cache_ssd_written_bytes"] == sum(p.stat().st_size for p in files(cache)) > 0
    cache.writes.persist_all()
    assert cache.writes.flush(30)
    on_disk = files(cache)
    assert len(on_disk) == 6  # a data file and a sidecar per entry
    assert cache.stats()["cache_ssd_written_bytes"] == sum(p.stat().st_size for p in on_disk)


def test_an_ssd_entry_is_restored_only_to_save_a_real_prefill(make_cache):
    cache = make_cache()
    entry = prompt(0, 400)
    store(cache, entry, session="s")
    assert settle(cache)["cache_ssd_writes"] == 1
    fresh = make_cache(ram_bytes=1 << 26)  # a restart: empty RAM, the same folder
    # Only the template in common: reading a whole file to save 10 tokens is not worth it.
    assert fresh.ssd_candidate("", list(prompt(1))) is None
    # A prefix of 300 tokens in common: a restore.
    assert fresh.ssd_candidate("", list(entry[:300]) + [5, 6]) is not None
    # RAM already holds 300 of the 400: the SSD would save 100 more, not enough.
    store(fresh, entry[:300], seed=1)
    assert fresh.ssd_candidate("", list(entry) + [5]) is None


def _jobs(cache: PromptCache) -> list:
    """The writes handed to the writer from now on (each still goes through)."""
    seen: list = []
    writer = cache.writes.writer
    put = writer.put

    def spy(job, block=False):
        seen.append(job)
        put(job, block)

    writer.put = spy
    return seen


def test_on_cuda_a_write_behind_reads_copies_and_a_spill_the_evicted_entry_itself(
    make_cache, monkeypatch
):
    """Where the CPU's read would move an entry out of device memory (CUDA, forced here), the
    writer reads copies of entries that stay in RAM, and the entry itself once RAM evicted it
    (no copy of what leaves the device anyway)."""
    from mlxd.worker.cache import kv_arrays

    monkeypatch.setattr(kv_arrays, "DEVICE_COPIES", True)
    one = entry_bytes(300)
    cache = make_cache(ram_bytes=one + one // 2)  # room for one entry
    jobs = _jobs(cache)
    store(cache, prompt(0), session="s-1")
    (kept,) = cache.ram.entries()
    settle(cache)
    assert len(jobs) == 1
    assert jobs[0].arrays["0.k"].ctypes.data != address(kept.layers[0].keys)  # a copy
    store(cache, prompt(1), session="s-2", seed=1)  # evicts s-1's entry (written already)
    (left,) = [e for e in cache.ram.entries() if e.session == "s-2"]
    evicted = cache.ssd.best("", list(prompt(0)))[0]
    assert evicted is not None and not cache.ram.covers("", prompt(0))
    store(cache, prompt(2), session="s-3", seed=2)  # evicts s-2's, not yet written: a spill
    assert cache.writes.flush(30)
    spilled = [j for j in jobs if j.session == "s-2"]
    assert len(spilled) == 1 and spilled[0].arrays["0.k"].ctypes.data == address(
        left.layers[0].keys
    )
    assert cache.writes.copy_bytes == 0


def test_device_copies_held_by_queued_writes_are_bounded(make_cache, monkeypatch):
    """A write-behind that would hold more than COPY_BYTES_MAX of copies waits for a later
    round instead of queueing; nothing is lost, and the count goes back to zero."""
    import threading

    from mlxd.worker.cache import kv_arrays, write_policy

    monkeypatch.setattr(kv_arrays, "DEVICE_COPIES", True)
    one = entry_bytes(300)
    monkeypatch.setattr(write_policy, "COPY_BYTES_MAX", one + one // 2)
    cache = make_cache()
    jobs = _jobs(cache)
    go = threading.Event()
    write = cache.ssd.write
    monkeypatch.setattr(cache.ssd, "write", lambda *a, **k: go.wait(30) and write(*a, **k))
    for i in range(3):
        store(cache, prompt(i), session=f"s-{i}", seed=i)
    cache.writes.maintain(time.monotonic() + 3600)
    assert len(jobs) == 1 and cache.writes.copy_bytes == one  # the others wait
    go.set()
    for _ in range(3):
        settle(cache)
    assert len(jobs) == 3 and len(cache.ssd) == 3 and cache.writes.copy_bytes == 0


def test_copies_come_back_whatever_happens_to_their_write(make_cache, monkeypatch):
    """A hand-off that fails gives its copies' bytes back; an entry larger than the bound, and
    one too large for RAM, is read in place (bounded memory; it never enters RAM); the writer
    lets go of a written job's arrays at once, not when the next job comes."""
    import gc
    import weakref

    from mlxd.worker.cache import kv_arrays, write_policy

    monkeypatch.setattr(kv_arrays, "DEVICE_COPIES", True)
    one = entry_bytes(300)
    cache = make_cache()
    real = write_policy.to_numpy
    monkeypatch.setattr(write_policy, "to_numpy", lambda *a, **k: 1 / 0)
    store(cache, prompt(0), session="s-0")
    cache.writes.maintain(time.monotonic() + 3600)
    assert cache.writes.copy_bytes == 0 and cache.writes.tally() == (0, 1)
    monkeypatch.setattr(write_policy, "to_numpy", real)

    seen: list = []
    writer = cache.writes.writer
    put = writer.put
    writer.put = lambda job, block=False: (seen.append(weakref.ref(job)), put(job, block))
    monkeypatch.setattr(write_policy, "COPY_BYTES_MAX", one - 1)  # the entry is larger
    (e,) = cache.ram.entries()
    settle(cache)
    assert len(seen) == 1 and cache.writes.copy_bytes == 0
    gc.collect()
    assert seen[0]() is None, "the writer still holds the written job"
    (job_entry,) = cache.ram.entries()
    assert job_entry is e and e.persisted

    monkeypatch.setattr(write_policy, "COPY_BYTES_MAX", 4 << 30)  # room for copies again
    small = make_cache(ram_bytes=one // 2)  # the same folder; every entry too large for RAM
    jobs = _jobs(small)
    big = layers(300, 1)
    small.store("", prompt(1), big, "s-1")
    assert small.writes.flush(30) and len(small.ram) == 0
    assert small.ssd.best("", list(prompt(1)))[0].session == "s-1"
    assert jobs[0].arrays["0.k"].ctypes.data == address(big[0].keys)  # in place
    assert small.writes.copy_bytes == 0
