"""Replies a cache entry remembers: the token ids the model generated, where they sit in it.

A reply comes back in the next turn as text inside the conversation, and tokenizing that text
again (through the chat template) may give other ids than the ones generated: BPE merges the
bytes differently. The prompt-cache match would stop there. `splice` puts the generated ids
back in place of the re-tokenized span, but only where the re-sent text is exactly the text
those ids decode to, so the model sees the same text either way (docs/design.md).

Pure: the tokenizer comes in as a `decode` callable; no MLX.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from itertools import islice

from mlxd.worker.cache.trie import common_prefix

# Tokens after a span that must decode the same either way: byte-level BPE decodes by
# concatenating bytes, so a few tokens past the boundary show any merge across it.
WINDOW = 8
REPLACEMENT = "\ufffd"  # a token that splits a character: its text does not round-trip


@dataclass(frozen=True)
class Reply:
    """Token ids the model generated, starting at position `at` of an entry's tokens."""

    at: int
    ids: tuple[int, ...]


@dataclass
class Spliced:
    """A prompt after `splice`: its ids, the replies now in it, and what changed where."""

    ids: list[int]
    replies: tuple[Reply, ...] = ()
    edits: tuple[tuple[int, int, int], ...] = ()  # (at in the spliced ids, removed, inserted)

    def shift(self, pos: int) -> int:
        """Where position `pos` of the prompt as rendered is in the spliced ids."""
        delta = 0
        for at, removed, inserted in self.edits:
            if at - delta + removed <= pos:
                delta += inserted - removed
        return pos + delta


def clip(replies: Sequence[Reply], n_tokens: int) -> tuple[Reply, ...]:
    """The replies that start inside an entry of `n_tokens` tokens."""
    return tuple(r for r in replies if r.at < n_tokens)


def splice(
    prompt: Sequence[int],
    tokens: Sequence[int],
    replies: Sequence[Reply],
    decode: Callable[[list[int]], str],
    texts: Collection[str],
) -> Spliced:
    """`prompt` with the generated ids of a cached entry's replies in place of their text.

    `tokens` are the entry's, `replies` its replies in order. Each reply where the prompt
    still agrees with the entry is either already there token for token (kept), or replaced
    when its text (all its ids, or all but the last: the end-of-turn token the template writes
    itself) is exactly one of `texts`, the conversation's assistant messages, and the prompt
    holds exactly that text there, on token boundaries. The first reply that is neither ends
    the walk: the prompt no longer lines up with the entry after it.
    """
    out = list(prompt)
    kept: list[Reply] = []
    edits: list[tuple[int, int, int]] = []
    agreed = 0  # out and tokens are known to agree this far: each reply costs its own length
    for r in replies:
        if not r.ids or r.at <= 0 or r.at >= len(out) or r.at < agreed:
            break
        agreed += common_prefix(islice(out, agreed, r.at), islice(tokens, agreed, r.at))
        if agreed < r.at:
            break
        if tuple(out[r.at : r.at + len(r.ids)]) == r.ids:
            kept.append(r)
            agreed = r.at + len(r.ids)
            continue
        for k in (len(r.ids), len(r.ids) - 1):
            ids = list(r.ids[:k])
            text = decode(ids) if k else ""
            if not text or REPLACEMENT in text or text not in texts:
                continue
            m = _align(out, r.at, ids, decode)
            if m is not None:
                out[r.at : r.at + m] = ids
                kept.append(Reply(r.at, tuple(ids)))
                edits.append((r.at, m, k))
                agreed = r.at + common_prefix(ids, islice(tokens, r.at, r.at + k))
                break
        else:
            break
    return Spliced(out, tuple(kept), tuple(edits))


def _align(out: list[int], at: int, ids: list[int], decode) -> int | None:
    """How many tokens of `out` from `at` hold exactly the text of `ids`, if a whole number do.

    Both sides are decoded after the token before `at`, so a tokenizer that drops a leading
    space at the start of what it decodes treats them alike; and a few tokens after the span
    must decode the same whichever ids stand before them.
    """
    ctx = out[at - 1 : at]
    want = decode(ctx + ids)
    lo, hi = 1, len(out) - at
    while lo < hi:  # the shortest span whose text is as long as the reply's
        mid = (lo + hi) // 2
        if len(decode(ctx + out[at : at + mid])) >= len(want):
            hi = mid
        else:
            lo = mid + 1
    if decode(ctx + out[at : at + lo]) != want:
        return None
    after = out[at + lo : at + lo + WINDOW]
    if decode(ctx + ids + after) != decode(ctx + out[at : at + lo] + after):
        return None
    return lo
