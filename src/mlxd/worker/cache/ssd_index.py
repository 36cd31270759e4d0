"""The SSD tier's index: its entries by key, a token trie per namespace, and their bytes.

What `best` searches and the byte cap counts; the least recently used entry is the next to go.
Thread-safe (the writer thread adds, the event loop searches, the engine thread drops); no file
I/O here, that is the store's (ssd.py).
"""

from __future__ import annotations

import threading

from mlxd.worker.cache.format import SsdEntry
from mlxd.worker.cache.trie import TokenTrie


class SsdIndex:
    """Entries of one SSD folder as the store knows them."""

    def __init__(self):
        self.nbytes = 0
        self._entries: dict[str, SsdEntry] = {}
        self._tries: dict[str, TokenTrie[SsdEntry]] = {}
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def entries(self) -> list[SsdEntry]:
        """Every entry, a snapshot."""
        with self._lock:
            return list(self._entries.values())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._tries.clear()
            self.nbytes = 0

    def add(self, e: SsdEntry) -> None:
        """Index `e`, replacing an entry under the same key."""
        with self._lock:
            old = self._entries.get(e.key)
            if old is not None:
                self.nbytes -= old.file_bytes
            self._entries[e.key] = e
            self._tries.setdefault(e.ns, TokenTrie()).insert(e.tokens, e)
            self.nbytes += e.file_bytes

    def forget(self, e: SsdEntry) -> bool:
        """Unindex `e`; False when it is gone already or a newer entry holds its key."""
        with self._lock:
            if self._entries.get(e.key) is not e:
                return False
            del self._entries[e.key]
            self.nbytes -= e.file_bytes
            self._tries[e.ns].remove(e.tokens)
            return True

    def best(self, ns: str, prompt: list[int], exact: bool = False) -> tuple[SsdEntry | None, int]:
        """The entry covering most of `prompt`, and how many tokens it covers.

        Attention KV trims: a longer entry that shares a prefix with the prompt serves that
        prefix. One prompt token always stays to be computed. `exact`: the entries are
        snapshots (windows, recurrent states) that serve only a prompt extending them whole.
        """
        with self._lock:
            trie = self._tries.get(ns)
            m = trie.search(prompt) if trie else None
        if m is None:
            return None, 0
        best, n = None, 0
        if exact:
            if m.shorter is not None and len(m.shorter[0]) < len(prompt):
                return m.shorter[1], len(m.shorter[0])
            return None, 0
        if m.shorter is not None:
            best, n = m.shorter[1], min(len(m.shorter[0]), len(prompt) - 1)
        if m.longer is not None and min(m.common, len(prompt) - 1) > n:
            best, n = m.longer[1], min(m.common, len(prompt) - 1)
        return (best, n) if n > 0 else (None, 0)

    def near(self, ns: str, prompt: list[int], limit: int) -> list[SsdEntry]:
        """Up to `limit` entries with replies sharing a prefix with `prompt`."""
        with self._lock:
            trie = self._tries.get(ns)
            return trie.around(prompt, limit, lambda e: bool(e.replies)) if trie else []

    def of_session(self, session: str) -> list[SsdEntry]:
        with self._lock:
            return [e for e in self._entries.values() if e.session == session]

    def least_recent(self) -> SsdEntry | None:
        """The entry to evict next (LRU), None when there is none."""
        with self._lock:
            if not self._entries:
                return None
            return min(self._entries.values(), key=lambda e: e.last_used)
