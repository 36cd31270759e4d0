"""A Hugging Face tokenizer rebuilt from a GGUF vocabulary, written as tokenizer.json and
tokenizer_config.json.

transformers' GGUF tokenizer conversion builds it (byte-level BPE, SentencePiece with Gemma's
and Phi-3's quirks, control and user-defined tokens, the split regex of each `tokenizer.ggml.pre`
it knows). Pre-tokenizers it does not know yet but llama.cpp does (SmolLM's one digit per token)
get llama.cpp's regexes here; the BOS rule comes from the file's `add_bos_token`.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, pre_tokenizers, processors

from mlxd.worker.importers.gguf_file import GGUFFile, GGUFImportError

# llama.cpp's pre-tokenizer regexes by tokenizer.ggml.pre (src/llama-vocab.cpp) for the names
# transformers lacks. llama.cpp splits with each regex in turn: a chain of "isolated" Splits.
_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
EXTRA_PRE_REGEXES = {
    **dict.fromkeys(("default", "gpt-2", "mpt", "olmo", "jais"), (_GPT2_RE,)),
    # one token per digit, as the original SmolLM / StarCoder tokenizers do
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
        (r"\p{N}", _GPT2_RE),
    ),
}
TOKENIZER_MODELS = ("gpt2", "llama")  # byte-level BPE, SentencePiece


def write_tokenizer(f: GGUFFile, folder: Path, max_length: int | None) -> None:
    """Write tokenizer.json and tokenizer_config.json rebuilt from the GGUF vocabulary."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_PRE_TOKENIZER_SPLITS,
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    model = f.value("tokenizer.ggml.model", None)
    if model not in TOKENIZER_MODELS:
        raise GGUFImportError(
            f"unsupported tokenizer model {model!r}; supported: gpt2 (byte-level BPE), "
            "llama (SentencePiece)"
        )
    pre = f.value("tokenizer.ggml.pre", "default")
    if model == "gpt2" and pre not in GGUF_PRE_TOKENIZER_SPLITS and pre not in EXTRA_PRE_REGEXES:
        known = sorted({*GGUF_PRE_TOKENIZER_SPLITS, *EXTRA_PRE_REGEXES})
        raise GGUFImportError(f"unsupported pre-tokenizer {pre!r}; supported: {', '.join(known)}")
    wanted = GGUF_TOKENIZER_MAPPING["tokenizer"]
    fields = {name: f.value(f"tokenizer.{key}", None) for key, name in wanted.items()}
    try:
        tok, _ = convert_gguf_tokenizer(f.arch, {k: v for k, v in fields.items() if v is not None})
    except (ValueError, KeyError, TypeError) as exc:
        raise GGUFImportError(f"cannot rebuild the tokenizer: {exc}") from exc
    if model == "gpt2" and pre in EXTRA_PRE_REGEXES:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), "isolated") for r in EXTRA_PRE_REGEXES[pre]]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    tokens = fields["tokens"]

    def token(key: str) -> str | None:
        tid = f.value(f"tokenizer.ggml.{key}_token_id", None)
        return tokens[int(tid)] if tid is not None and int(tid) < len(tokens) else None

    # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise
    add_bos = bool(f.value("tokenizer.ggml.add_bos_token", model == "llama"))
    bos = token("bos")
    if add_bos and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0",
            pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, tokens.index(bos))],
        )
    elif model == "gpt2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        tok.post_processor = None
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
        "chat_template": f.value("tokenizer.chat_template", None),
    }
    config = {k: v for k, v in config.items() if v is not None}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
