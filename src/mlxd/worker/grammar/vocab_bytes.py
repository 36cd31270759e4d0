"""The exact bytes each token id stands for, as a grammar engine needs them.

Decoding one token at a time loses bytes (a piece of a UTF-8 character decodes to U+FFFD), so
tokens are mapped from their vocabulary strings: byte-level BPE (GPT-2, Llama 3, Qwen) through
the byte-to-unicode table, SentencePiece through its ▁ and <0xNN> conventions.
"""

from __future__ import annotations

from mlx_lm.tokenizer_utils import (
    BPEStreamingDetokenizer,
    SPMStreamingDetokenizer,
    _byte_decoder,
)


def token_bytes(tokenizer) -> dict[int, bytes]:
    """{token id: bytes} for every id of `tokenizer` (an mlx-lm TokenizerWrapper)."""
    vocab: dict[str, int] = tokenizer.get_vocab()
    added = {
        i: t.content for i, t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items()
    }
    kind = type(getattr(tokenizer, "_detokenizer", None))
    out: dict[int, bytes] = {}
    for piece, token_id in vocab.items():
        if token_id in added:  # added tokens are stored as plain text
            out[token_id] = added[token_id].encode()
        elif issubclass(kind, BPEStreamingDetokenizer):
            out[token_id] = _bpe_bytes(piece)
        elif issubclass(kind, SPMStreamingDetokenizer):
            out[token_id] = _spm_bytes(piece)
        else:
            out[token_id] = tokenizer.decode([token_id]).encode()
    return out


def _bpe_bytes(piece: str) -> bytes:
    table = _byte_decoder()
    try:
        return bytes(table[c] for c in piece)
    except KeyError:  # not a byte-level piece after all
        return piece.encode()


def _spm_bytes(piece: str) -> bytes:
    if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
        return bytes([int(piece[3:5], 16)])
    return piece.replace("\u2581", " ").encode()
