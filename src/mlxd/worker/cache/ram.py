"""The RAM tier of the prompt cache: KV states of prompt prefixes, byte-capped, LRU.

Lives on the engine thread; `peek` may be called from the event loop (a lock guards the index).
Entries hold compact caches (exactly their tokens in buffers of their own, `compact`), so
`nbytes` is true bytes: a slice would keep its row's whole buffer alive, uncounted.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from mlx_lm.models.cache import can_trim_prompt_cache

from mlxd.worker.cache.entry_caches import usable_length, view
from mlxd.worker.cache.replies import Reply
from mlxd.worker.cache.trie import TokenTrie

# A reuse at least this long saves a real prefill: it earns an entry its SSD write, and an SSD
# restore must save this much. Unrelated prompts share ~10 chat-template tokens, never this many.
EARN_TOKENS = 256


@dataclass(eq=False)
class Entry:
    """One cached prompt prefix."""

    ns: str
    tokens: tuple[int, ...]
    layers: list
    nbytes: int
    session: str | None = None
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    persisted: bool = False  # durable on the SSD tier
    queued: bool = False  # a write to the SSD tier is pending
    ram_only: bool = False  # a cache type the SSD tier cannot hold
    hits: int = 0  # reuses of at least EARN_TOKENS, its own or those of prefixes it replaced
    replies: tuple[Reply, ...] = ()  # the generated ids among its tokens (replies.py)
    guess: bool = False  # read ahead from the SSD tier, no request has used it yet

    @property
    def key(self) -> tuple[str, tuple[int, ...]]:
        return self.ns, self.tokens

    @property
    def trimmable(self) -> bool:
        return can_trim_prompt_cache(self.layers)

    @property
    def earned(self) -> bool:
        """Worth an SSD write before any drain: it belongs to a session, or it was reused."""
        return self.session is not None or self.hits > 0


class RamCache:
    """Token-trie index over entries, with a byte cap and LRU (session entries kept longest).

    A fetch reusing at least `earn_tokens` counts as a hit of the entry it came from."""

    def __init__(
        self,
        cap_bytes: int,
        on_evict: Callable[[Entry], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        earn_tokens: int = EARN_TOKENS,
    ):
        self.cap_bytes = cap_bytes
        self.earn_tokens = earn_tokens
        self.on_evict = on_evict or (lambda e: None)
        self.clock = clock
        self.nbytes = 0
        self._tries: dict[str, TokenTrie[Entry]] = {}
        self._lru: OrderedDict[tuple, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = {"hits": 0, "misses": 0, "hit_tokens": 0, "evictions": 0}

    def __len__(self) -> int:
        return len(self._lru)

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._lru.values())

    def best(self, ns: str, prompt: list[int]) -> tuple[Entry | None, int]:
        """The entry reusing the most of `prompt` and how many tokens it covers."""
        with self._lock:
            trie = self._tries.get(ns)
            if trie is None:
                return None, 0
            m = trie.search(prompt)
        best, best_n = None, 0
        if m.shorter is not None:
            e = m.shorter[1]
            n = usable_length(len(e.tokens), len(e.tokens), len(prompt), e.trimmable, True)
            best, best_n = (e, n) if n > 0 else (None, 0)
        if m.longer is not None:
            e = m.longer[1]
            n = usable_length(len(e.tokens), m.common, len(prompt), e.trimmable, False)
            if n > best_n:
                best, best_n = e, n
        return best, best_n

    def near(self, ns: str, prompt: list[int], limit: int) -> list[Entry]:
        """Entries with replies that share a prefix with `prompt` (replies.py splices them)."""
        with self._lock:
            trie = self._tries.get(ns)
            return trie.around(prompt, limit, lambda e: bool(e.replies)) if trie else []

    def covers(self, ns: str, tokens: tuple[int, ...]) -> bool:
        """Whether an entry holds `tokens`, or extends them and can be cut back to them
        (best() would leave the last token of an exact match to prefill, so it cannot tell).
        A window or recurrent state past `tokens` cannot: a sliding-window or hybrid model's
        snapshot at a prompt's length is its own entry, not covered by the turn after it."""
        with self._lock:
            trie = self._tries.get(ns)
            if trie is None:
                return False
            m = trie.search(tokens)
        exact = m.shorter is not None and len(m.shorter[0]) == len(tokens)
        longer = m.longer[1] if m.common == len(tokens) and m.longer is not None else None
        return exact or (longer is not None and longer.trimmable)

    def peek(self, ns: str, prompt: list[int]) -> int:
        return self.best(ns, prompt)[1]

    def fetch(self, ns: str, prompt: list[int]) -> tuple[list | None, int]:
        """Caches for the longest reusable prefix of `prompt` (a hit refreshes recency)."""
        e, n = self.best(ns, prompt)
        if e is None:
            self.stats["misses"] += 1
            return None, 0
        with self._lock:
            if e.key in self._lru:
                self._lru.move_to_end(e.key)
        e.last_used = self.clock()
        e.guess = False
        if n >= self.earn_tokens:
            e.hits += 1
        self.stats["hits"] += 1
        self.stats["hit_tokens"] += n
        return view(e.layers, n, len(e.tokens)), n

    def insert(
        self,
        ns: str,
        tokens: tuple[int, ...],
        layers: list,
        session: str | None = None,
        persisted: bool = False,
        hits: int = 0,
        replies: tuple[Reply, ...] = (),
        guess: bool = False,
    ) -> Entry | None:
        """Store a compact cache for `tokens`; strict prefixes a trimmable entry covers go.
        `guess`: the SSD read-ahead's (read_ahead.py), first in line for eviction until a
        request uses it, each after those inserted before it (they come newest first).

        The new entry inherits the hits of the entries it replaces: turn N+1 of a conversation
        extends a prefix that was reused."""
        nbytes = sum(c.nbytes for c in layers)
        if self.cap_bytes <= 0 or nbytes > self.cap_bytes or not tokens:
            return None
        entry = Entry(
            ns, tokens, layers, nbytes, session, persisted=persisted, hits=hits, replies=replies
        )
        with self._lock:
            trie = self._tries.setdefault(ns, TokenTrie())
            old = trie.insert(tokens, entry)
            if old is not None:
                self._forget(old)
                entry.persisted = entry.persisted or old.persisted
                entry.session = entry.session or old.session
                entry.hits += old.hits
                entry.replies = entry.replies or old.replies
            self._lru[entry.key] = entry
            self.nbytes += nbytes
            covered = trie.prefixes_of(tokens) if entry.trimmable else []
            for _, p in covered:
                trie.remove(p.tokens)
                self._forget(p)
                entry.hits += p.hits
            # A guess that replaces what a request used stands for it: ranked as that was.
            replaced = [p for _, p in covered] + ([old] if old is not None else [])
            entry.guess = guess and all(p.guess for p in replaced)
            if entry.guess:
                self._lru.move_to_end(entry.key, last=False)
        self._enforce_cap()
        return entry

    def drop(self, entry: Entry) -> None:
        with self._lock:
            trie = self._tries.get(entry.ns)
            if trie is not None and trie.remove(entry.tokens) is not None:
                self._forget(entry)

    def drop_session(self, session: str) -> int:
        victims = [e for e in self.entries() if e.session == session]
        for e in victims:
            self.drop(e)
        return len(victims)

    def _forget(self, e: Entry) -> None:
        if self._lru.pop(e.key, None) is not None:
            self.nbytes -= e.nbytes

    def _enforce_cap(self) -> None:
        while self.nbytes > self.cap_bytes and self._lru:
            with self._lock:
                # Guesses nobody used go first, then entries without a session; session
                # entries are kept together longest.
                victim = next(
                    (e for e in self._lru.values() if e.guess),
                    next(
                        (e for e in self._lru.values() if e.session is None),
                        next(iter(self._lru.values())),
                    ),
                )
            self.drop(victim)
            self.stats["evictions"] += 1
            self.on_evict(victim)
