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
