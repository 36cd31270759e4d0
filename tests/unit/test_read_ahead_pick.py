"""Which SSD entries a worker reads back into RAM at start (worker/cache/read_ahead.py)."""

from __future__ import annotations

from mlxd.worker.cache.format import SsdEntry
from mlxd.worker.cache.read_ahead import pick


def entry(key: str, nbytes: int, used: float) -> SsdEntry:
    return SsdEntry(key, "ns", (1, 2, 3), nbytes, "0" * 64, None, used)


def test_newest_first_while_they_fit_and_a_smaller_older_one_fills_the_rest():
    old, mid, new, big = (
        entry("old", 30, 1.0),
        entry("mid", 50, 2.0),
        entry("new", 40, 3.0),
        (entry("big", 500, 4.0)),
    )
    # big is newest but larger than the room: skipped; then new (40), mid (50): 90 of 100;
    # old (30) no longer fits.
    assert [e.key for e in pick([old, mid, new, big], 100)] == ["new", "mid"]
    assert [e.key for e in pick([old, mid, new, big], 120)] == ["new", "mid", "old"]


def test_no_room_reads_nothing():
    assert pick([entry("a", 1, 1.0)], 0) == []
    assert pick([], 1 << 30) == []


class _Busy:
    """An engine with a row in flight for its first `polls` looks, then none."""

    adapters = None

    def __init__(self, polls: int):
        self.polls, self.looks, self.read_at = polls, 0, []

    @property
    def queued_rows(self) -> int:
        return 0

    def rows_in_flight(self) -> list:
        self.looks += 1
        return ["row"] if self.looks <= self.polls else []

    async def call(self, fn, what):
        return fn()


def _worker(engine, entries, generating):
    """The worker state the read-ahead reads: an SSD index of `entries`, 100 bytes of RAM."""
    import types

    ram = types.SimpleNamespace(cap_bytes=100, nbytes=0, covers=lambda ns, t: False)
    ssd = types.SimpleNamespace(disabled=None, index=types.SimpleNamespace(entries=lambda: entries))
    cache = types.SimpleNamespace(
        ssd=ssd, ram=ram, read_ahead={"entries": 0, "bytes": 0, "done": 0}, warm=lambda e, a: True
    )
    return types.SimpleNamespace(
        prompt_cache=cache,
        engine=engine,
        draining=False,
        started=True,
        cache_ns="ns",
        generating=generating,
    )


def test_the_read_ahead_waits_for_the_rows_in_flight_before_each_read(monkeypatch):
    import asyncio

    from mlxd.worker.cache import read_ahead as ra

    monkeypatch.setattr(ra, "QUIET_POLL_S", 0)
    engine = _Busy(polls=3)
    state = _worker(engine, [entry("a", 10, 2.0), entry("b", 10, 1.0)], generating=0)
    cache = state.prompt_cache

    async def read_once(c, e, use):
        engine.read_at.append((e.key, engine.looks))
        return {}

    asyncio.run(ra.read_ahead(state, read_once))
    # Not one read while the row was in flight (looks 1-3); then both, newest first.
    assert engine.read_at == [("a", 4), ("b", 5)]
    assert cache.read_ahead == {"entries": 2, "bytes": 20, "done": 1}


def test_the_read_ahead_waits_for_a_request_still_being_prepared(monkeypatch):
    """A request counts from its parse (render, its own SSD read), before the engine has it."""
    import asyncio

    from mlxd.worker.cache import read_ahead as ra

    monkeypatch.setattr(ra, "QUIET_POLL_S", 0)
    engine = _Busy(polls=0)  # nothing in the engine at any time
    state = _worker(engine, [entry("a", 10, 1.0)], generating=1)

    async def read_once(c, e, use):
        engine.read_at.append((e.key, state.generating))
        return {}

    async def main():
        task = asyncio.create_task(ra.read_ahead(state, read_once))
        for _ in range(20):  # the request is prepared meanwhile: no read
            await asyncio.sleep(0)
        assert engine.read_at == []
        state.generating = 0
        await task

    asyncio.run(main())
    assert engine.read_at == [("a", 0)]


def test_the_read_ahead_starts_before_ready_and_reads_adapters_mounted_at_ready(monkeypatch):
    """The first read runs beside the warm-up; the namespaces are looked at again before each
    entry, so an adapter mounted at READY has its entries read too."""
    import asyncio
    import types

    from mlxd.worker.cache import read_ahead as ra

    monkeypatch.setattr(ra, "QUIET_POLL_S", 0)
    engine = _Busy(polls=0)
    engine.adapters = types.SimpleNamespace(mounted={})
    entries = [entry("base", 10, 2.0), SsdEntry("lora", "ns+a1", (1,), 10, "0" * 64, None, 3.0)]
    state = _worker(engine, entries, generating=0)
    state.started = False

    async def read_once(c, e, use):
        engine.read_at.append((e.key, state.started))
        return {}

    async def main():
        task = asyncio.create_task(ra.read_ahead(state, read_once))
        for _ in range(20):  # warming up: the base model's entry is read meanwhile
            await asyncio.sleep(0)
        assert engine.read_at == [("base", False)] and not task.done()
        engine.adapters.mounted = {"a1": types.SimpleNamespace(cache_ns="+a1")}
        state.started = True  # READY, the adapter mounted
        await task

    asyncio.run(main())
    assert engine.read_at == [("base", False), ("lora", True)]
    assert state.prompt_cache.read_ahead == {"entries": 2, "bytes": 20, "done": 1}


def test_entries_are_read_while_the_engine_thread_warms_up_and_taken_in_after(monkeypatch):
    """The engine thread takes nothing during the warm-up: every entry that fits the room is
    read meanwhile (their bytes held against it), and all go into RAM once it is over."""
    import asyncio

    from mlxd.worker.cache import read_ahead as ra

    monkeypatch.setattr(ra, "QUIET_POLL_S", 0)
    warmed = asyncio.Event()
    engine = _Busy(polls=0)
    taken: list[str] = []

    async def call(fn, what):  # as Engine.call: run on the engine thread after the warm-up
        await warmed.wait()
        return fn()

    engine.call = call
    # 100 bytes of room: a, b, c (30 each) fit with 10 left; d (30) does not, e (10) does.
    entries = [entry(k, n, t) for k, n, t in [("a", 30, 5), ("b", 30, 4), ("c", 30, 3)]]
    entries += [entry("d", 30, 2), entry("e", 10, 1)]
    state = _worker(engine, entries, generating=0)
    state.started = False
    state.prompt_cache.warm = lambda e, arrays: taken.append(e.key) or True

    async def read_once(c, e, use):
        engine.read_at.append(e.key)
        return {}

    async def main():
        task = asyncio.create_task(ra.read_ahead(state, read_once))
        for _ in range(50):
            await asyncio.sleep(0)
        assert engine.read_at == ["a", "b", "c", "e"] and taken == []  # all read, none in
        warmed.set()
        state.started = True
        await task

    asyncio.run(main())
    assert taken == ["a", "b", "c", "e"]
    assert state.prompt_cache.read_ahead == {"entries": 4, "bytes": 100, "done": 1}


def test_a_stopped_worker_leaves_no_unretrieved_error_from_an_entry_on_its_way_in(monkeypatch):
    """The worker cancels the read-ahead when it stops; the engine then answers the entry it
    had not taken in yet with an error, which nobody awaits any more: nothing is reported."""
    import asyncio
    import gc

    from mlxd.shared.errors import Unavailable
    from mlxd.worker.cache import read_ahead as ra

    monkeypatch.setattr(ra, "QUIET_POLL_S", 0)
    stopped = None
    engine = _Busy(polls=0)

    async def call(fn, what):  # the engine is warming up, then stops without taking it
        await stopped.wait()
        raise Unavailable("the engine stopped")

    engine.call = call
    state = _worker(engine, [entry("a", 10, 1.0)], generating=0)
    state.started = False
    reported: list = []

    async def read_once(c, e, use):
        return {}

    async def main():
        nonlocal stopped
        stopped = asyncio.Event()
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx))
        task = asyncio.create_task(ra.read_ahead(state, read_once))
        for _ in range(20):
            await asyncio.sleep(0)
        task.cancel()  # the worker stops
        stopped.set()
        for _ in range(20):
            await asyncio.sleep(0)
        gc.collect()

    asyncio.run(main())
    assert reported == []
