"""Import a llama-family GGUF file as an mlx-lm model folder (`mlxctl import-gguf`).

`mx.load` reads GGUF and already maps Q4_0 / Q4_1 / Q8_0 blocks onto MLX affine quantization
(uint32 weight + float16 scales and biases, group size 32), so quantized tensors stay quantized.
This module renames them to mlx-lm's llama names, un-permutes Q/K rows, writes config.json with
per-layer quantization, and rebuilds tokenizer.json from the GGUF vocabulary.

    python -m mlxd.worker.importers.gguf FILE --models-dir DIR [--id NAME] [--overwrite]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
from mlx_lm.utils import save_config
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from mlxd.shared.exit_codes import EXIT_USAGE

SUPPORTED_ARCHITECTURES = frozenset({"llama"})
_TYPE_NAMES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    30: "BF16",
}
# GGML types mx.load maps faithfully -> bits once imported (0: a float tensor, kept as is).
_KEPT_BITS = {0: 0, 1: 0, 30: 0, 2: 4, 3: 4, 8: 8}
_GROUP_SIZE = 32  # every GGUF block type mx.load keeps quantized has 32 weights per block

# GGUF tensor name (after "blk.N.") -> mlx-lm llama module path; the inverse of mlx_lm.gguf.
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


class GGUFImportError(ValueError):
    """The file cannot be imported: not GGUF, or an unsupported architecture or tensor type."""


def import_gguf(
    gguf_path: Path, models_dir: Path, model_id: str | None = None, *, overwrite: bool = False
) -> Path:
    """Convert a llama-family GGUF file into the mlx-lm model folder `models_dir/<id>/`.

    The id defaults to the file name, sanitized. The folder is built in a dot-prefixed temporary
    folder inside `models_dir` and renamed into place at the end, so a failed import leaves
    nothing behind. Raises GGUFImportError for anything unsupported; returns the folder.
    """
    gguf_path, models_dir = Path(gguf_path), Path(models_dir)
    model_id = _check_id(model_id) if model_id else sanitize_id(gguf_path.name)
    target = models_dir / model_id
    if target.exists() and not overwrite:
        raise GGUFImportError(f"{target} already exists (pass overwrite=True / --overwrite)")
    header, tensor_types = read_header(gguf_path)
    check_supported(header, tensor_types)
    arch = header["general.architecture"]
    try:
        weights, meta = mx.load(str(gguf_path), return_metadata=True)
    except Exception as exc:  # mlx raises RuntimeError / ValueError with its own text
        raise GGUFImportError(f"{gguf_path}: cannot load GGUF tensors: {exc}") from exc

    models_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{model_id}.", suffix=".importing", dir=models_dir))
    try:
        config = build_config(meta, arch)
        weights, quantization = convert_weights(weights, tensor_types, config)
        if quantization:
            config["quantization"] = quantization
        # One file: mlx-lm loads any model*.safetensors, and the GGUF was one file too.
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        save_config(config, tmp / "config.json")
        write_tokenizer(meta, tmp, config.get("max_position_embeddings"))
        tmp.chmod(0o755)  # mkdtemp made it private; a model folder is not
        _swap_into_place(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def sanitize_id(file_name: str) -> str:
    """A model id from a file name: lower case, `.gguf` dropped, odd characters as `-`."""
    stem = re.sub(r"\.gguf$", "", file_name, flags=re.IGNORECASE).lower()
    return re.sub(r"[^a-z0-9._-]+", "-", stem).strip(".-") or "model"


def _check_id(model_id: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", model_id):
        raise GGUFImportError(f"invalid model id {model_id!r}: use letters, digits, . _ -")
    return model_id


def read_header(path: Path) -> tuple[dict, dict[str, int]]:
    """Read a GGUF header: ({scalar metadata key: value}, {tensor name: GGML type id}).

    Parsed here rather than taken from mx.load because mx.load silently turns some K-quants
    into float16 and fails on others with a bare message; the header says what each tensor is.
    """
    try:
        with open(path, "rb") as f:
            return _parse_header(f)
    except (OSError, struct.error, UnicodeDecodeError, MemoryError, OverflowError) as exc:
        raise GGUFImportError(f"{path}: not a readable GGUF file ({exc})") from exc


def _parse_header(f) -> tuple[dict, dict[str, int]]:
    fixed = dict(enumerate("BbHhIif?")) | {10: "Q", 11: "q", 12: "d"}  # GGUF value types

    def unpack(fmt: str):
        return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

    def value(vtype: int):
        if vtype in fixed:
            return unpack(fixed[vtype])
        if vtype == 8:  # string
            return f.read(unpack("Q")).decode("utf-8")
        if vtype != 9:
            raise GGUFImportError(f"{f.name}: corrupt GGUF header (value type {vtype})")
        etype, count = unpack("I"), unpack("Q")  # array: skipped, only scalars are kept
        if etype in fixed:
            f.seek(count * struct.calcsize(fixed[etype]), 1)
        else:
            for _ in range(count):
                value(etype)
        return None

    if f.read(4) != b"GGUF":
        raise GGUFImportError(f"{f.name}: not a GGUF file (bad magic bytes)")
    if (version := unpack("I")) not in (2, 3):
        raise GGUFImportError(f"{f.name}: unsupported GGUF version {version}")
    n_tensors, n_kv = unpack("Q"), unpack("Q")
    meta = {value(8): value(unpack("I")) for _ in range(n_kv)}
    types = {}
    for _ in range(n_tensors):
        name = value(8)
        f.seek(8 * unpack("I"), 1)  # dims
        types[name], _offset = unpack("I"), unpack("Q")
    return meta, types


def check_supported(header: dict, tensor_types: dict[str, int]) -> None:
    """Raise GGUFImportError naming the architecture, tokenizer or tensor type not handled."""
    arch = header.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFImportError(
            f"unsupported architecture {arch!r}; "
            f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )
    if (tok_model := header.get("tokenizer.ggml.model")) != "gpt2":
        raise GGUFImportError(
            f"unsupported tokenizer model {tok_model!r}; supported: gpt2 (byte-level BPE)"
        )
    if (pre := header.get("tokenizer.ggml.pre", "gpt-2")) not in _PRE_REGEXES:
        raise GGUFImportError(
            f"unsupported pre-tokenizer {pre!r}; supported: {', '.join(sorted(_PRE_REGEXES))}"
        )
    for name, ggml_type in tensor_types.items():
        if ggml_type not in _KEPT_BITS:
            kind = _TYPE_NAMES.get(ggml_type, f"GGML type {ggml_type}")
            kept = ", ".join(_TYPE_NAMES[t] for t in _KEPT_BITS)
            raise GGUFImportError(
                f"unsupported tensor type {kind} (tensor {name}); supported: {kept}"
            )
        _module_path(name)  # raises on tensors with no llama counterpart


def _module_path(gguf_name: str) -> str:
    base = gguf_name.removesuffix(".weight")
    if m := re.fullmatch(r"blk\.(\d+)\.(\w+)", base):
        if m.group(2) in _LAYER_NAMES:
            return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    elif base in _TOP_NAMES:
        return _TOP_NAMES[base]
    if base == "rope_freqs":
        raise GGUFImportError("unsupported tensor rope_freqs (Llama 3.1-style rope scaling)")
    raise GGUFImportError(f"unsupported tensor {gguf_name}: no llama counterpart")


def _meta(meta: dict, key: str, default=KeyError):
    if key not in meta:
        if default is KeyError:
            raise GGUFImportError(f"GGUF metadata lacks {key}")
        return default
    value = meta[key]
    return value.item() if isinstance(value, mx.array) and value.ndim == 0 else value


def build_config(meta: dict, arch: str) -> dict:
    """config.json for mlx-lm's llama model from the GGUF's `<arch>.*` metadata."""
    n_heads = int(_meta(meta, f"{arch}.attention.head_count"))
    hidden = int(_meta(meta, f"{arch}.embedding_length"))
    head_dim = int(_meta(meta, f"{arch}.attention.key_length", hidden // n_heads))
    if int(_meta(meta, f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise GGUFImportError("unsupported partial rotary embedding (rope.dimension_count)")
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_attention_heads": n_heads,
        "head_dim": head_dim,
        "num_hidden_layers": int(_meta(meta, f"{arch}.block_count")),
        "intermediate_size": int(_meta(meta, f"{arch}.feed_forward_length")),
        "num_key_value_heads": int(_meta(meta, f"{arch}.attention.head_count_kv", n_heads)),
        # GGUF stores float32: 7 digits give back the 1e-05 the model was trained with
        "rms_norm_eps": float(f"{_meta(meta, f'{arch}.attention.layer_norm_rms_epsilon'):.7g}"),
        "rope_theta": float(_meta(meta, f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_meta(meta, f"{arch}.context_length", 4096)),
        "vocab_size": len(_meta(meta, "tokenizer.ggml.tokens")),
        # Q/K rows are un-permuted in convert_weights, so the standard (non-interleaved) rope.
        "rope_traditional": False,
    }
    scaling = _meta(meta, f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        factor = float(_meta(meta, f"{arch}.rope.scaling.factor"))
        config["rope_scaling"] = {"type": "linear", "factor": factor}
    elif scaling != "none":
        raise GGUFImportError(f"unsupported rope scaling type {scaling!r}")
    if (bos := _meta(meta, "tokenizer.ggml.bos_token_id", None)) is not None:
        config["bos_token_id"] = int(bos)
    # eot/eom end a turn in chat models (Llama 3); mlx-lm stops on every id listed here.
    eos = [
        int(v)
        for k in ("eos", "eot", "eom")
        if (v := _meta(meta, f"tokenizer.ggml.{k}_token_id", None)) is not None
    ]
    if eos:
        config["eos_token_id"] = eos[0] if len(set(eos)) == 1 else sorted(set(eos))
    return config


def _unpermute_rows(w: mx.array, n_heads: int) -> mx.array:
    # llama.cpp's converter interleaves each head's rows for its rope layout:
    # reshape(n, 2, d/2).swapaxes(1, 2). This is its inverse. Quantization groups run along
    # the input dim, so the same row permutation applies to packed weights, scales and biases.
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def convert_weights(
    raw: dict, tensor_types: dict[str, int], config: dict
) -> tuple[dict[str, mx.array], dict]:
    """Rename GGUF tensors to mlx-lm names; return (weights, quantization config)."""
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    weights, bits_of = {}, {}
    for name, value in raw.items():
        gguf_name, suffix = name.rsplit(".", 1)
        ggml_type = tensor_types.get(f"{gguf_name}.weight", tensor_types.get(name))
        path = _module_path(f"{gguf_name}.weight")
        if role := re.fullmatch(r"blk\.\d+\.(attn_[qk])", gguf_name):
            value = _unpermute_rows(value, heads[role.group(1)])
        if value.dtype in (mx.float32, mx.bfloat16):
            # One float dtype: float32 norms next to float16 scales would promote every
            # activation to float32 and slow decoding down for no quality gain.
            value = value.astype(mx.float16)
        weights[f"{path}.{suffix}"] = value
        if ggml_type is not None and value.ndim == 2 and suffix == "weight":
            bits_of[path] = _KEPT_BITS[ggml_type]
    config["tie_word_embeddings"] = "lm_head.weight" not in weights
    expected = {f"{p}.weight" for p in _TOP_NAMES.values() if p != "lm_head"} | {
        f"model.layers.{i}.{p}.weight"
        for i in range(config["num_hidden_layers"])
        for p in _LAYER_NAMES.values()
    }
    if missing := sorted(expected - weights.keys()):
        raise GGUFImportError(f"GGUF lacks {len(missing)} llama tensor(s), e.g. {missing[0]}")
    quantized = [b for b in bits_of.values() if b]
    if not quantized:
        return weights, {}
    bits = max(set(quantized), key=quantized.count)  # the most common type is the default
    quant = {"group_size": _GROUP_SIZE, "bits": bits}
    for path, b in sorted(bits_of.items()):  # per-layer overrides, read by mlx-lm's loader
        if b != bits:
            quant[path] = {"group_size": _GROUP_SIZE, "bits": b} if b else False
    return weights, quant


# llama.cpp's pre-tokenizer regexes by tokenizer.ggml.pre (src/llama-vocab.cpp). llama.cpp splits
# with each regex in turn, keeping unmatched text as pieces: a chain of "isolated" Splits.
_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_RE = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_REGEXES = {
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
    tokens = list(_meta(meta, "tokenizer.ggml.tokens"))
    types = _meta(meta, "tokenizer.ggml.token_type", None)
    types = types.tolist() if isinstance(types, mx.array) else [1] * len(tokens)
    pre = _meta(meta, "tokenizer.ggml.pre", "gpt-2")
    merges = [tuple(m.split(" ", 1)) for m in _meta(meta, "tokenizer.ggml.merges")]
    tok = Tokenizer(
        models.BPE(
            vocab={t: i for i, t in enumerate(tokens)},
            merges=merges,
            ignore_merges=pre in ("llama3", "llama-v3", "llama-bpe"),
        )
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), "isolated") for r in _PRE_REGEXES[pre]]
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
        tid = _meta(meta, f"tokenizer.ggml.{key}_token_id", None)
        return tokens[int(tid)] if tid is not None and int(tid) < len(tokens) else None

    bos, add_bos = token("bos"), bool(_meta(meta, "tokenizer.ggml.add_bos_token", False))
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
        "chat_template": _meta(meta, "tokenizer.chat_template", None),
    }
    config = {k: v for k, v in config.items() if v is not None}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))


def _swap_into_place(tmp: Path, target: Path) -> None:
    old = None
    if target.exists():  # overwrite: move the old folder aside first so a rename can't fail
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        target.rename(old / target.name)
    tmp.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; prints the model folder as the last line of stdout."""
    parser = argparse.ArgumentParser(
        prog="python -m mlxd.worker.importers.gguf",
        description="Import a llama-family GGUF as an mlx-lm model.",
    )
    parser.add_argument("gguf", type=Path, help="the .gguf file")
    parser.add_argument("--models-dir", type=Path, required=True, help="where model folders live")
    parser.add_argument("--id", dest="model_id", help="model id (default: from the file name)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing folder")
    args = parser.parse_args(argv)
    try:
        folder = import_gguf(args.gguf, args.models_dir, args.model_id, overwrite=args.overwrite)
    except GGUFImportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
