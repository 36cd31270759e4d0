"""Model folders for the benchmark: random-weight models of a known shape, and what the client
needs to know about any model folder (its end-of-sequence ids, a tokenizer to size prompts).

Shapes other than `tiny` copy the real architecture's config (so compute and memory traffic
match the real model) but not its weights: speed does not depend on what the weights say.
The Qwen3 shapes are here; the other families' (Gemma 3, hybrids) are in family_shapes.py.
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

from . import family_shapes

ROOT = Path(__file__).resolve().parents[1]
# Where random-weight models of the larger shapes stay between runs (building one takes a while).
MODEL_CACHE = Path.home() / ".cache" / "mlxd-bench" / "models"

# The architecture halves of the published Qwen3 configs (Hugging Face Qwen/Qwen3-*).
_QWEN3_COMMON = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "head_dim": 128,
    "hidden_act": "silu",
    "attention_bias": False,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 40960,
    "vocab_size": 151936,
    "torch_dtype": "bfloat16",
}
SHAPES: dict[str, dict] = {
    "qwen3-0.6b": {
        **_QWEN3_COMMON,
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "intermediate_size": 3072,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "tie_word_embeddings": True,
    },
    "qwen3-8b": {
        **_QWEN3_COMMON,
        "hidden_size": 4096,
        "num_hidden_layers": 36,
        "intermediate_size": 12288,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
    },
}
SHAPE_NAMES = ("tiny", *SHAPES, *family_shapes.NAMES)
_SHARD_BYTES = 2 * 1024**3
_MARKER = ".bench-model.json"  # written last: a folder without it is an interrupted build
_FORMAT = 1


def tests_module(name: str):
    """A plain module of tests/ meant to be shared with the bench (tests/ is not a package):
    tiny_model.py, lora_adapters.py."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    return importlib.import_module(name)


def _tiny_builder():
    return tests_module("tiny_model").build_tiny_model


def cached_model(shape: str) -> Path:
    """The random-weight model of `shape` in MODEL_CACHE, built there on first use."""
    return build_model(shape, MODEL_CACHE / shape)


def build_model(shape: str, dest: Path, seed: int = 0) -> Path:
    """Write a random-weight model folder of `shape` at `dest` (reused if already complete)."""
    marker = dest / _MARKER
    want = {"shape": shape, "seed": seed, "format": _FORMAT}
    if marker.exists() and json.loads(marker.read_text()) == want:
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    # The tiny model gives us the tokenizer files, the chat template and generation_config.
    _tiny_builder()(dest, arch="qwen3", seed=seed)
    if shape != "tiny":
        family = shape not in SHAPES
        config = family_shapes.family_config(shape) if family else dict(SHAPES[shape])
        tokenizer_json = json.loads((dest / "tokenizer.json").read_text())
        _pad_vocab(dest / "tokenizer.json", tokenizer_json, config["vocab_size"])
        eos_id, eot_id = (_token_id(tokenizer_json, t) for t in ("<|im_end|>", "<|endoftext|>"))
        config.update(bos_token_id=eot_id, eos_token_id=eos_id)
        (dest / "generation_config.json").write_text(
            json.dumps({"bos_token_id": eot_id, "eos_token_id": [eos_id, eot_id]}, indent=2) + "\n"
        )
        (dest / "model.safetensors").unlink()
        (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if family:
            _write_shards(dest, family_shapes.model_weights(config, seed))
        else:
            _write_shards(dest, _random_weights(config, seed))
    marker.write_text(json.dumps(want))
    return dest


def alias_model(src: Path, dest: Path) -> Path:
    """A second model folder with the same files (symlinks): a distinct model to load."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name.startswith("."):
            continue
        link = dest / f.name
        if not link.exists():
            link.symlink_to(f.resolve())
    return dest


def _token_id(tokenizer_json: dict, token: str) -> int:
    for t in tokenizer_json.get("added_tokens", []):
        if t["content"] == token:
            return t["id"]
    return tokenizer_json["model"]["vocab"][token]


def _pad_vocab(path: Path, tokenizer_json: dict, vocab_size: int) -> None:
    """Give every embedding row a token, so whatever a random model samples can be decoded.

    The extra entries are plain words (`Ġw123` decodes to " w123"); no merges reach them, so
    they never appear when encoding, only when decoding sampled ids. The special tokens move to
    the top ids, as in Qwen: `tokenizers` renumbers added tokens that sit inside the vocab.
    """
    vocab = tokenizer_json["model"]["vocab"]
    added = tokenizer_json.get("added_tokens", [])
    first_added = vocab_size - len(added)
    for i in range(len(vocab), first_added):
        vocab[f"\u0120w{i}"] = i
    for k, t in enumerate(sorted(added, key=lambda t: t["id"])):
        t["id"] = first_added + k
    path.write_text(json.dumps(tokenizer_json, ensure_ascii=False))


def _weight_shapes(c: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, hd, inter = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (c["vocab_size"], h))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (q, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "self_attn.q_norm.weight", (hd,)),
            (p + "self_attn.k_norm.weight", (hd,)),
            (p + "mlp.gate_proj.weight", (inter, h)),
            (p + "mlp.up_proj.weight", (inter, h)),
            (p + "mlp.down_proj.weight", (h, inter)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    out.append(("model.norm.weight", (h,)))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", (c["vocab_size"], h)))
    return out


def _random_weights(config: dict, seed: int):
    """(name, lazy array) for a Qwen3 config: N(0, 0.02) matrices, norm scales of ones."""
    import mlx.core as mx  # only the model builder needs MLX; the client never does

    mx.random.seed(seed)
    for name, shape in _weight_shapes(config):
        if len(shape) == 1:  # norm scales: ones, as a freshly initialised model has
            yield name, mx.ones(shape, dtype=mx.bfloat16)
        else:
            yield name, mx.random.normal(shape, dtype=mx.bfloat16, scale=0.02)


def _write_shards(dest: Path, weights) -> None:
    """bf16 safetensors shards plus the index, as Hugging Face checkpoints are laid out.

    `weights` yields (name, lazy MLX array); the shards are planned from the arrays' sizes,
    then each is computed, written and freed in turn: one shard in memory at a time.
    """
    import mlx.core as mx

    shards: list[dict] = [{}]
    size = 0
    for name, w in weights:
        if size and size + w.nbytes > _SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = w
        size += w.nbytes
    n = len(shards)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{n:05d}.safetensors"
        mx.eval(shard)
        mx.save_safetensors(str(dest / fname), shard, metadata={"format": "mlx"})
        for name, w in shard.items():
            weight_map[name] = fname
            total += w.nbytes
        shard.clear()  # free each shard once written: the large shapes are 15-25 GB
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (dest / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def eos_token_ids(model_dir: Path) -> list[int]:
    """Every id either server may stop on: config, generation_config and the tokenizer's eos."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        ids |= _as_ids(_read_json(model_dir / name).get("eos_token_id"))
    eos = _read_json(model_dir / "tokenizer_config.json").get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    tok = load_text_tokenizer(model_dir)
    if isinstance(eos, str) and tok is not None and tok.token_to_id(eos) is not None:
        ids.add(tok.token_to_id(eos))
    return sorted(ids)


def no_eos_bias(model_dir: Path) -> dict[str, float]:
    """A logit_bias that forbids stopping, so both servers generate exactly max_tokens."""
    return {str(i): -100.0 for i in eos_token_ids(model_dir)}


def load_text_tokenizer(model_dir: Path):
    """The folder's fast tokenizer (to size prompts in tokens), or None if it has none."""
    path = model_dir / "tokenizer.json"
    if not path.exists():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _as_ids(value) -> set[int]:
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, int)}
    return set()
