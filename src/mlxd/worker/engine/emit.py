"""Emission: the tokens a step produced become each row's Event (text, logprobs, the end).

Runs on the engine thread; `sink` hands the event to the request's asyncio side. A row that
ends (end of sequence, a stop string, its token limit) hands its prompt state to the cache.
A row whose first token was sampled in this step gets it now (`send_first`), not after the
next step's decode forward and prefill chunk, where mlx-lm's order returns it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

from mlxd.worker.engine.batch import Batch
from mlxd.worker.engine.recovery import generation_failed
from mlxd.worker.engine.rows import Event
from mlxd.worker.engine.step.logprobs import logprob_entry

log = logging.getLogger("mlxd.worker.engine.loop")


def emit(batch: Batch, responses, firsts: Sequence[tuple[int, int, Any]] = ()) -> list[int]:
    """Hand each row its token from this step, then each row that entered decoding in it its
    first token (uid, token, its log-probabilities or None); one row's failure ends that row
    only. Returns the uids sent a first token ahead."""
    ahead = []
    for r in [*responses, *(Ahead(uid, tok, None, lp) for uid, tok, lp in firsts)]:
        if r.uid not in batch.rows:
            continue  # failed during this step already
        try:
            if isinstance(r, Ahead):
                if send_first(batch, r):
                    ahead.append(r.uid)
            else:
                on_token(batch, r)
        except Exception:
            rid = batch.rows[r.uid].sub.rid if r.uid in batch.rows else r.uid
            log.exception("row %s failed", rid)
            batch.fail(r.uid, generation_failed(str(rid)))
    return ahead


class Ahead(NamedTuple):
    """A token sent at the end of the step that drew it (the response on_token reads)."""

    uid: int
    token: int
    finish_reason: None = None
    logprobs: Any = None  # (vocabulary,) when the decode batch kept them


def send_first(batch: Batch, r: Ahead) -> bool:
    """Send a row the token it drew in this step, ahead of the decode step that returns it.

    Only where that step cannot end the row there (an end-of-sequence token, its last token
    by max_tokens): what ends a row comes with the decode step's response, as do a row's
    log-probabilities where the batch kept none this time. A stop string it completes ends
    the row now (on_token)."""
    row = batch.rows[r.uid]
    if row.sent_ahead or r.token in batch.eos_ids:
        return False
    if row.sub.params.logprobs and r.logprobs is None:
        return False
    max_tokens = row.sub.params.max_tokens
    if max_tokens is not None and row.generated + 1 >= max_tokens:
        return False
    on_token(batch, r)
    row.sent_ahead = True
    return True


def on_token(batch: Batch, r) -> None:
    """One generated token of one row: detokenize, cut at stop strings, send the event."""
    row = batch.rows.get(r.uid)
    if row is None:
        return
    if row.sent_ahead:  # this token went out at the end of the step that drew it
        row.sent_ahead = False
        assert r.finish_reason is None, "a token that ends its row is never sent ahead"
        return
    row.generated += 1
    if row.generated == 1:
        batch.first_tokens.add(row)
    row.tokens.append(r.token)
    finish = r.finish_reason
    logprobs = None
    if row.sub.params.logprobs:
        logprobs = [logprob_entry(r.logprobs, r.token, row.sub.params.top_logprobs)]
    if finish == "stop":  # only end-of-sequence tokens are token-level stops here
        text = row.text.finish()
    else:
        text = row.text.push(r.token)
        if row.text.stopped:
            batch.remove_keeping_cache(row)
            finish = "stop"
        elif finish == "length":
            text += row.text.finish()
    if r.finish_reason is not None:
        batch.store(row, r.all_tokens, r.prompt_cache)
    if finish is not None:
        batch.finish(row)
    row.sub.sink(Event(text, row.generated, finish, logprobs))
