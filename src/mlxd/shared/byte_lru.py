"""A least-recently-used cache capped by bytes rather than by count: compiled grammars (one
index is kilobytes or hundreds of megabytes, so a count cap bounds nothing), decoded images and
processed image pixels. Not thread-safe: callers that share one across threads lock around it.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class ByteLRU:
    """`get` refreshes recency; `put` evicts the least recently used entries to fit the cap.

    An entry larger than the whole cap is not kept (the caller still uses it once).
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[Any, tuple[Any, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Any) -> Any | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: Any, value: Any, size_bytes: int) -> bool:
        """Keep `value`; False when it is too large to keep at all."""
        self.pop(key)
        if size_bytes > self.max_bytes:
            return False
        while self._items and self.bytes + size_bytes > self.max_bytes:
            _, (_, old) = self._items.popitem(last=False)
            self.bytes -= old
        self._items[key] = (value, size_bytes)
        self.bytes += size_bytes
        return True

    def pop(self, key: Any) -> None:
        item = self._items.pop(key, None)
        if item is not None:
            self.bytes -= item[1]
