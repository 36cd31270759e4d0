"""What a request tells the prompt cache: namespace, session, prompt boundary, SSD restore."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from aiohttp import web
from pydantic import BaseModel

from mlxd.worker.cache.trie import common_prefix

log = logging.getLogger("mlxd.worker.cache")

SESSION_HEADER = "x-session-affinity"
SESSION_FIELDS = ("session_id", "prompt_cache_key")


@dataclass
class CacheKey:
    ns: str = ""
    session: str | None = None
    boundary: int = 0
    restored: tuple | None = None
    replies: tuple = ()  # earlier replies' generated ids in the prompt (replies.py)


def session_of(request: web.Request, body: BaseModel) -> str | None:
    """`session_id` / `prompt_cache_key` in the body, else the x-session-affinity header."""
    extra = {**(body.model_extra or {}), **body.__dict__}
    for name in SESSION_FIELDS:
        value = extra.get(name)
        if isinstance(value, str) and value:
            return value[:256]
    header = request.headers.get(SESSION_HEADER)
    return header[:256] if header else None


def stable_boundary(
    tokenizer, messages: list[dict], kwargs: dict, prompt: list[int], text: str | None = None
) -> int:
    """Tokens of the conversation without the generation primer: the next turn starts so.

    Rendered again without add_generation_prompt; the shared prefix with the full prompt is
    the point where turn N+1's prompt still equals turn N's. Where the prompt's `text` is
    that rendering plus a primer that starts with a special token (ChatML's `<|im_start|>`,
    Gemma's `<start_of_turn>`, Llama 3's `<|start_header_id|>`), only the primer is encoded:
    a tokenizer splits at special tokens before anything else, so the conversation's tokens
    are the prompt's up to the primer's (a 40k-token conversation is not encoded twice).
    """
    try:
        stable = tokenizer.apply_chat_template(
            messages, add_generation_prompt=False, tokenize=False, **kwargs
        )
    except Exception:
        return 0
    if (
        text is not None
        and text.startswith(stable)
        and _special_first(tokenizer, text[len(stable) :])
    ):
        tail = tokenizer.encode(text[len(stable) :], add_special_tokens=False)
        if 0 < len(tail) < len(prompt) and list(prompt[len(prompt) - len(tail) :]) == tail:
            return len(prompt) - len(tail)
    return common_prefix(tokenizer.encode(stable, add_special_tokens=False), prompt)


def _special_first(tokenizer, tail: str) -> bool:
    """Whether `tail` starts with one of the tokenizer's special tokens (and the tokenizer
    splits at them: not with `split_special_tokens`, which reads them as plain text)."""
    try:
        if getattr(tokenizer, "split_special_tokens", False):
            return False
        specials = tokenizer.all_special_tokens
    except Exception:
        return False
    return any(t and tail.startswith(t) for t in specials)


def suffix_boundary(
    tokenizer, messages: list[dict], kwargs: dict, text: str, ids: list[int]
) -> int:
    """The stable boundary of a prompt whose ids are not the plain tokenization of its text
    (images expanded by a processor): the conversation rendered without the generation
    primer is a prefix of the prompt's text, and the primer's tokens end its ids."""
    try:
        stable = tokenizer.apply_chat_template(
            messages, add_generation_prompt=False, tokenize=False, **kwargs
        )
    except Exception:
        return 0
    if not text.startswith(stable):
        return 0
    tail = tokenizer.encode(text[len(stable) :], add_special_tokens=False)
    if len(tail) >= len(ids) or list(ids[len(ids) - len(tail) :]) != list(tail):
        return 0
    return len(ids) - len(tail)


async def make_cache_key(
    state, prompt: list[int], session: str | None, boundary: int = 0, *, ns: str
) -> CacheKey:
    """Build the key (`ns`: its namespace, chat/state.py adapter_ns); when the SSD tier
    covers more of the prompt than RAM, read it now.

    The read and its integrity check run in a thread, so the engine never waits on the disk.
    """
    cache = state.prompt_cache
    key = CacheKey(ns=ns, session=session, boundary=boundary)
    if cache is None:
        return key
    entry = cache.ssd_candidate(key.ns, prompt)
    if entry is not None:
        try:
            arrays = await read_once(cache, entry)
        except Exception:  # the SSD tier is an optimisation: a failed read is a miss
            log.exception("reading SSD cache entry %s failed", entry.key)
            arrays = None
        if arrays is not None:
            key.restored = (entry, arrays)
    return key


_reads: dict[str, tuple[asyncio.Task, bool]] = {}


async def read_once(cache, entry, use: bool = True):
    """One read of an SSD entry however many requests want it at once (say, agents sharing a
    system prompt right after a restart): they share the arrays instead of each holding a copy.
    `use`: a request's read (the entry's use counted once); False: the read-ahead's guess."""
    got = _reads.get(entry.key)
    if got is None:
        task = asyncio.ensure_future(asyncio.to_thread(cache.read_ssd, entry, use))
        got = _reads[entry.key] = (task, use)
        task.add_done_callback(lambda _t, k=entry.key: _reads.pop(k, None))  # type: ignore[misc]
    task, counted = got
    arrays = await asyncio.shield(task)
    if use and not counted and arrays is not None and cache.ssd is not None:
        cache.ssd.used(entry)  # a request took what the read-ahead was reading
    return arrays
