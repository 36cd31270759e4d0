"""A Hugging Face tokenizer rebuilt from a GGUF vocabulary (byte-level BPE, llama.cpp's
pre-tokenizer regexes), written as tokenizer.json and tokenizer_config.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from mlxd.worker.importers.gguf_file import meta_value

# llama.cpp's pre-tokenizer regexes by tokenizer.ggml.pre (src/llama-vocab.cpp). llama.cpp splits
# with each regex in turn, keeping unmatched text as pieces: a chain of "isolated" Splits.
_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_RE = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_REGEXES = {
    **dict.fromkeys(("gpt-2", "mpt", "olmo", "jais"), (_GPT2_RE,)),
    # one token per digit, as the original SmolLM / StarCoder tokenizers do
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
        (r"\p{N}", _GPT2_RE),
    ),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe"), (_LLAMA3_RE,)),
}
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values


def write_tokenizer(meta: dict, folder: Path, max_length: int | None) -> None:
    """Write tokenizer.json and tokenizer_config.json rebuilt from the GGUF vocabulary."""
    tokens = list(meta_value(meta, "tokenizer.ggml.tokens"))
    types = meta_value(meta, "tokenizer.ggml.token_type", None)
    types = types.tolist() if isinstance(types, mx.array) else [1] * len(tokens)
    pre = meta_value(meta, "tokenizer.ggml.pre", "gpt-2")
    merges = [tuple(m.split(" ", 1)) for m in meta_value(meta, "tokenizer.ggml.merges")]
    tok = Tokenizer(
        models.BPE(
            vocab={t: i for i, t in enumerate(tokens)},
            merges=merges,
            ignore_merges=pre in ("llama3", "llama-v3", "llama-bpe"),
        )
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), "isolated") for r in PRE_REGEXES[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens(
        [
            AddedToken(t, special=ty == _CONTROL, normalized=False)
            for t, ty in zip(tokens, types)
            if ty in (_CONTROL, _USER_DEFINED)
        ]
    )

    def token(key: str) -> str | None:
        tid = meta_value(meta, f"tokenizer.ggml.{key}_token_id", None)
        return tokens[int(tid)] if tid is not None and int(tid) < len(tokens) else None

    bos, add_bos = token("bos"), bool(meta_value(meta, "tokenizer.ggml.add_bos_token", False))
    if add_bos and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0",
            pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, tokens.index(bos))],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "bos_token": bos,
        "eos_token": token("eos"),
        "unk_token": token("unknown"),
        "pad_token": token("padding"),
        "model_max_length": max_length,
        "chat_template": meta_value(meta, "tokenizer.chat_template", None),
    }
    config = {k: v for k, v in config.items() if v is not None}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
