"""Emission: the tokens a step produced become each row's Event (text, logprobs, the end).

Runs on the engine thread; `sink` hands the event to the request's asyncio side. A row that
ends (end of sequence, a stop string, its token limit) hands its prompt state to the cache.
"""

from __future__ import annotations

import logging

from mlxd.worker.engine.batch import Batch
from mlxd.worker.engine.recovery import generation_failed
from mlxd.worker.engine.rows import Event
from mlxd.worker.engine.step.logprobs import logprob_entry

log = logging.getLogger("mlxd.worker.engine.loop")


def emit(batch: Batch, responses) -> None:
    """Hand each row its token from this step; one row's failure ends that row only."""
    for r in responses:
        if r.uid not in batch.rows:
            continue  # failed during this step already
        try:
            on_token(batch, r)
        except Exception:
            rid = batch.rows[r.uid].sub.rid if r.uid in batch.rows else r.uid
            log.exception("row %s failed", rid)
            batch.fail(r.uid, generation_failed(str(rid)))


def on_token(batch: Batch, r) -> None:
    """One generated token of one row: detokenize, cut at stop strings, send the event."""
    row = batch.rows.get(r.uid)
    if row is None:
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
