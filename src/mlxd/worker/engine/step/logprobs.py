"""Engine logprob entries in OpenAI's two shapes (chat and legacy completions)."""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx


def logprob_entry(logprobs: mx.array, token: int, top_k: int) -> dict:
    """The sampled token's log-probability and the `top_k` most likely, on the engine thread."""
    entry: dict[str, Any] = {"token_id": token, "logprob": logprobs[token].item(), "top": []}
    if top_k:
        top = mx.argpartition(-logprobs, top_k - 1)[:top_k]
        # cast: mlx's stub types tolist() as list or scalar; a 1-D array gives a list
        ids, lps = cast(list[int], top.tolist()), cast(list[float], logprobs[top].tolist())
        entry["top"] = sorted(zip(ids, lps), key=lambda x: -x[1])
    return entry


def _tok(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id])


def chat_logprobs(tokenizer, entries: list[dict]) -> dict:
    """`choice.logprobs` of a chat completion: {"content": [...]}."""
    content = []
    for e in entries:
        text = _tok(tokenizer, e["token_id"])
        content.append(
            {
                "token": text,
                "logprob": e["logprob"],
                "bytes": list(text.encode()),
                "top_logprobs": [
                    {"token": (t := _tok(tokenizer, tid)), "logprob": lp, "bytes": list(t.encode())}
                    for tid, lp in e["top"]
                ],
            }
        )
    return {"content": content}


def completion_logprobs(tokenizer, entries: list[dict], offset: int = 0) -> dict:
    """`choice.logprobs` of a text completion: parallel lists."""
    tokens, lps, tops, offsets = [], [], [], []
    for e in entries:
        text = _tok(tokenizer, e["token_id"])
        tokens.append(text)
        lps.append(e["logprob"])
        tops.append({_tok(tokenizer, tid): lp for tid, lp in e["top"]})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def join_rows(
    old: mx.array | None, n_old: int, new: mx.array | None, n_new: int
) -> mx.array | None:
    """Two batches' (rows, vocab) log-probabilities as one, zeros for a side that kept none;
    None when neither did."""
    if n_old == 0 or old is None and new is None:
        return new
    known = new if new is not None else old
    assert known is not None  # the early return took the case where both are None
    vocab = known.shape[-1]
    old = old if old is not None else mx.zeros((n_old, vocab))
    new = new if new is not None else mx.zeros((n_new, vocab))
    return mx.concatenate([old, new.astype(old.dtype)])
