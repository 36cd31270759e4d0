"""A chat prompt gets back the ids the model generated for the replies it re-sends.

The conversation comes back as text; where the prompt cache remembers an entry whose replies'
ids decode to exactly an assistant message's text, those ids replace the re-tokenized span
(cache/replies.py), and the cache then matches the whole earlier turn.
"""

from __future__ import annotations

import logging

from mlxd.worker.cache.replies import Spliced, splice
from mlxd.worker.cache.trie import common_prefix
from mlxd.worker.chat.state import WorkerState

log = logging.getLogger("mlxd.worker.chat")

CANDIDATES = 4  # cache entries tried per prompt: the work a request causes stays bounded


def assistant_texts(messages: list[dict]) -> set[str]:
    """The text of every assistant message, as a reply the model wrote would read."""
    out = set()
    for msg in messages:
        if msg.get("role") != "assistant":
            continue
        content = msg.get("content")
        if isinstance(content, list):  # text parts, as the templates join them
            content = "".join(
                str(p.get("text") or "")
                for p in content
                if isinstance(p, dict) and p.get("type") == "text"
            )
        if isinstance(content, str) and content:
            out.add(content)
    return out


def splice_replies(
    state: WorkerState, tokenizer, messages: list[dict], ids: list[int], ns: str
) -> Spliced:
    """`ids` with earlier replies' generated ids back in place, where the text is unchanged
    (from entries of namespace `ns`: chat/state.py adapter_ns).

    Of the entries near the prompt, the one the spliced prompt then shares most with wins."""
    cache = state.prompt_cache
    best = Spliced(list(ids))
    if cache is None:
        return best
    texts = assistant_texts(messages)
    best_n = -1
    for tokens, replies in cache.near(ns, ids, CANDIDATES):
        s = splice(ids, tokens, replies, tokenizer.decode, texts)
        n = common_prefix(s.ids, tokens)
        if n > best_n:
            best, best_n = s, n
    if best.edits:
        cache.reply_splices += 1
        log.debug("prompt: %d reply span(s) given back their generated ids", len(best.edits))
    return best
