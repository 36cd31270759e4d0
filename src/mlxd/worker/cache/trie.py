"""A token trie: find the cached prompt that shares the longest prefix with a new prompt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")

_END = -1  # key under which a node stores the value that ends there


def common_prefix(a, b) -> int:
    """How many leading tokens two sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Match(Generic[V]):
    """The best entries for a prompt: one that is a prefix of it, one that extends it."""

    shorter: tuple[tuple[int, ...], V] | None  # longest entry that is a prefix of the prompt
    longer: tuple[tuple[int, ...], V] | None  # an entry sharing `common` tokens, longer than that
    common: int  # tokens of the prompt matched along the trie


class TokenTrie(Generic[V]):
    """Maps token sequences to values; lookups walk the prompt once."""

    def __init__(self):
        self._root: dict = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def insert(self, tokens: tuple[int, ...], value: V) -> V | None:
        node = self._root
        for t in tokens:
            node = node.setdefault(t, {})
        old = node.get(_END)
        node[_END] = (tokens, value)
        if old is None:
            self._size += 1
        return old[1] if old else None

    def remove(self, tokens: tuple[int, ...]) -> V | None:
        path = [self._root]
        for t in tokens:
            nxt = path[-1].get(t)
            if nxt is None:
                return None
            path.append(nxt)
        old = path[-1].pop(_END, None)
        if old is None:
            return None
        self._size -= 1
        for t, parent in zip(reversed(tokens), reversed(path[:-1])):
            if parent[t]:
                break
            del parent[t]  # prune empty branches
        return old[1]

    def search(self, prompt: list[int] | tuple[int, ...]) -> Match[V]:
        node = self._root
        shorter = None
        common = 0
        for t in prompt:
            if _END in node:
                shorter = node[_END]
            nxt = node.get(t)
            if nxt is None:
                break
            node = nxt
            common += 1
        else:
            if _END in node:
                shorter = node[_END]
        longer = None
        if common and (shorter is None or common > len(shorter[0])):
            longer = self._any_below(node)
        return Match(shorter=shorter, longer=longer, common=common)

    @staticmethod
    def _any_below(node: dict):
        # Any entry in this subtree shares the walked prefix; take the first found.
        stack = [node]
        while stack:
            n = stack.pop()
            if _END in n:
                return n[_END]
            stack.extend(v for k, v in n.items() if k != _END)
        return None

    def around(self, prompt, limit: int, want=lambda v: True) -> list[V]:
        """Up to `limit` values passing `want` near `prompt`: the longest entry that is a
        prefix of it, then entries that leave the prompt's path, those that leave it last
        first (they share the most with it). Entries that share nothing are never near."""
        path, shorter = [self._root], None
        for t in prompt:
            if _END in path[-1]:
                shorter = path[-1][_END]
            nxt = path[-1].get(t)
            if nxt is None:
                break
            path.append(nxt)
        else:
            if _END in path[-1]:
                shorter = path[-1][_END]
        out = [shorter[1]] if shorter is not None and want(shorter[1]) else []
        for depth in range(len(path) - 1, 0, -1):  # the root's other branches share nothing
            on_path = prompt[depth] if depth < len(prompt) else None
            stack = [v for k, v in path[depth].items() if k != _END and k != on_path]
            while stack and len(out) < limit:
                n = stack.pop()
                end = n.get(_END)
                if end is not None and want(end[1]):
                    out.append(end[1])
                stack.extend(v for k, v in n.items() if k != _END)
            if len(out) >= limit:
                break
        return out[:limit]

    def prefixes_of(self, tokens: tuple[int, ...]) -> list[tuple[tuple[int, ...], V]]:
        """Entries that are strict prefixes of `tokens`."""
        out, node = [], self._root
        for t in tokens[:-1] if tokens else ():
            nxt = node.get(t)
            if nxt is None:
                break
            node = nxt
            if _END in node:
                out.append(node[_END])
        return out
