"""Engine logprob entries in OpenAI's two shapes (chat and legacy completions)."""

from __future__ import annotations


def _tok(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id])


def chat_logprobs(tokenizer, entries: list[dict]) -> dict:
    """`choice.logprobs` of a chat completion: {"content": [...]}."""
    content = []
    for e in entries:
        text = _tok(tokenizer, e["token_id"])
        content.append({
            "token": text,
            "logprob": e["logprob"],
            "bytes": list(text.encode()),
            "top_logprobs": [
                {"token": (t := _tok(tokenizer, tid)), "logprob": lp, "bytes": list(t.encode())}
                for tid, lp in e["top"]
            ],
        })
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
