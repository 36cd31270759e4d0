"""Tiny random-weight vision-language model folders, and mlx-vlm's own generation as the oracle.

`build_vlm(dest, family)` writes a folder that both `mlx_vlm.load` (model and processor) and
`mlx_lm.load` (the text model; mlx-lm drops the vision weights) open offline: a config with
text_config and vision_config as real checkpoints carry, float32 weights drawn by MLX with a
fixed seed for mlx-vlm's own model classes, the tiny byte-level BPE tokenizer of tiny_model.py
plus the family's special tokens, a chat template that places the family's image marker where
a message has an image part, and the processor files. Images are small (32 px), so an image
costs a handful of tokens.

Families: "gemma3" (SigLIP tower, Gemma3 projector, gemma3 text model with sliding windows)
and "mistral3" (Pixtral tower, patch merger, a mistral text model that mlx-lm loads as llama).

`build_vlm(..., sizes=...)` writes the same folder at other sizes (bench/vision.py's real-size
shapes): real text and vision configs, the tokenizer padded to the real vocabulary, weights
drawn one matrix at a time in bf16 and written by the caller's writer (shards).

`oracle(path, messages, images, max_tokens)` is mlx-vlm's greedy generation for a chat, done
through mlx-vlm's public functions, so tests can check mlxd's vision engine against it.
Plain module (no pytest) so benchmarks and scripts can use it too.
"""

from __future__ import annotations

import json
import pathlib

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from PIL import Image
from tokenizers import AddedToken

from tiny_model import _build_tokenizer

FAMILIES = ("gemma3", "mistral3")

IMAGE_PX = 32  # the processors resize images to at most this many pixels a side
PATCH = 8
_TEXT_H = 128
_VISION_H = 64
_GAIN = 4.0  # layer weights against MLX's default init, as in families.py
_PROJECTOR_GAIN = 8.0  # so the image's features move the logits, not just the text around it

_GEMMA_TOKENS = {
    "bos_token": "<bos>",
    "eos_token": "<eos>",
    "pad_token": "<pad>",
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}
_GEMMA_TURN = ["<start_of_turn>", "<end_of_turn>"]

# Like the real Gemma 3 template: a system message is folded into the first user turn, the
# assistant speaks as "model", and an image part becomes <start_of_image>, which the
# processor expands to "\n\n<start_of_image>" + soft tokens + "<end_of_image>\n\n".
GEMMA3_TEMPLATE = """\
{%- macro body(content) -%}
{%- if content is string -%}{{ content | trim }}
{%- elif content is not none -%}
{%- for part in content -%}
{%- if part.type == 'image' -%}{{ '<start_of_image>' }}
{%- elif part.type == 'text' -%}{{ part.text | trim }}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- set ns = namespace(prefix='') -%}
{%- if messages and messages[0].role == 'system' -%}
{%- set ns.prefix = body(messages[0].content) + '\\n\\n' -%}
{%- set messages = messages[1:] -%}
{%- endif -%}
{%- for message in messages -%}
{%- set role = 'model' if message.role == 'assistant' else message.role -%}
{{- '<start_of_turn>' + role + '\\n' + (ns.prefix if loop.first else '') -}}
{{- body(message.content) + '<end_of_turn>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}
"""

_MISTRAL_SPECIAL = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]"]
_MISTRAL_SPECIAL += ["[/SYSTEM_PROMPT]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"]

# Like Mistral Small 3.1's template: [INST]...[/INST] turns, an image part becomes [IMG],
# which the processor expands to rows of [IMG] split by [IMG_BREAK] and closed by [IMG_END].
MISTRAL3_TEMPLATE = """\
{%- macro body(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is not none -%}
{%- for part in content -%}
{%- if part.type == 'image' -%}{{ '[IMG]' }}
{%- elif part.type == 'text' -%}{{ part.text }}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- for message in messages -%}
{%- if message.role == 'system' -%}
{{- '[SYSTEM_PROMPT]' + body(message.content) + '[/SYSTEM_PROMPT]' -}}
{%- elif message.role == 'user' -%}
{{- '[INST]' + body(message.content) + '[/INST]' -}}
{%- elif message.role == 'assistant' -%}
{{- body(message.content) + eos_token -}}
{%- endif -%}
{%- endfor -%}
"""


def _text_config(family: str, vocab_size: int) -> dict:
    common = {
        "hidden_size": _TEXT_H,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "max_position_embeddings": 4096,
    }
    if family == "gemma3":
        # Both spellings of the global rope base: mlx-lm reads rope_theta, mlx-vlm the other.
        return {
            **common,
            "model_type": "gemma3_text",
            "num_hidden_layers": 4,
            "query_pre_attn_scalar": 32,
            "sliding_window": 16,
            "sliding_window_pattern": 2,
            "rope_theta": 1_000_000.0,
            "rope_global_base_freq": 1_000_000.0,
            "rope_local_base_freq": 10_000.0,
            "mm_tokens_per_image": 4,
        }
    return {
        **common,
        "model_type": "mistral",
        "num_hidden_layers": 2,
        "rope_theta": 1_000_000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
    }


def _config(family: str, tok) -> dict:
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    text = _text_config(family, vocab_size)
    if family == "gemma3":
        return {
            "architectures": ["Gemma3ForConditionalGeneration"],
            "model_type": "gemma3",
            "text_config": text,
            "vision_config": {
                "model_type": "siglip_vision_model",
                "hidden_size": _VISION_H,
                "intermediate_size": 128,
                "num_attention_heads": 2,
                "num_hidden_layers": 1,
                "patch_size": PATCH,
                "image_size": IMAGE_PX,
                "layer_norm_eps": 1e-6,
                "vision_use_head": False,
            },
            "mm_tokens_per_image": 4,
            "boi_token_index": tok.token_to_id("<start_of_image>"),
            "eoi_token_index": tok.token_to_id("<end_of_image>"),
            "image_token_index": tok.token_to_id("<image_soft_token>"),
            "pad_token_id": tok.token_to_id("<pad>"),
            "bos_token_id": tok.token_to_id("<bos>"),
            "eos_token_id": [tok.token_to_id("<eos>"), tok.token_to_id("<end_of_turn>")],
            "vocab_size": vocab_size,
            "torch_dtype": "float32",
        }
    return {
        "architectures": ["Mistral3ForConditionalGeneration"],
        "model_type": "mistral3",
        "text_config": text,
        "vision_config": {
            "model_type": "pixtral",
            "hidden_size": _VISION_H,
            "intermediate_size": 128,
            "num_attention_heads": 2,
            "head_dim": _VISION_H // 2,
            "num_hidden_layers": 1,
            "patch_size": PATCH,
            "image_size": IMAGE_PX,
            "rope_theta": 10000.0,
            "num_channels": 3,
        },
        "image_token_index": tok.token_to_id("[IMG]"),
        "spatial_merge_size": 2,
        "multimodal_projector_bias": False,
        "projector_hidden_act": "gelu",
        "vision_feature_layer": -1,
        "bos_token_id": tok.token_to_id("<s>"),
        "eos_token_id": tok.token_to_id("</s>"),
        "vocab_size": vocab_size,
        "torch_dtype": "float32",
    }


def _tokenizer(family: str, vocab_size: int | None = None):
    """tiny_model's BPE tokenizer with the family's special tokens appended; padded to
    `vocab_size` ids when given."""
    tok = _build_tokenizer()
    names = list(_GEMMA_TOKENS.values()) + _GEMMA_TURN if family == "gemma3" else _MISTRAL_SPECIAL
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in names])
    return tok if vocab_size is None else _padded(tok, vocab_size)


def _padded(tok, vocab_size: int):
    """`tok` with plain filler words up to `vocab_size` ids, so a model with the real vocab
    (its LM head at full size) can decode whatever it samples. No merge reaches the fillers:
    encoding is unchanged; the added tokens move to the top ids."""
    from tokenizers import Tokenizer

    data = json.loads(tok.to_str())
    vocab, added = data["model"]["vocab"], sorted(data["added_tokens"], key=lambda t: t["id"])
    first_added = vocab_size - len(added)
    for i in range(len(vocab), first_added):
        vocab[f"\u0120w{i}"] = i
    for k, t in enumerate(added):
        t["id"] = first_added + k
    return Tokenizer.from_str(json.dumps(data))


def _processor_files(
    family: str, dest: pathlib.Path, image_px: int = IMAGE_PX, image_tokens: int = 4
) -> None:
    if family == "gemma3":
        pre = {
            "image_processor_type": "Gemma3ImageProcessor",
            "processor_class": "Gemma3Processor",
            "do_resize": True,
            "size": {"height": image_px, "width": image_px},
            "resample": 2,
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "do_convert_rgb": None,
            "do_pan_and_scan": None,
        }
        proc = {"processor_class": "Gemma3Processor", "image_seq_length": image_tokens}
    else:
        pre = {
            "image_processor_type": "PixtralImageProcessor",
            "processor_class": "PixtralProcessor",
            "do_resize": True,
            "size": {"longest_edge": image_px},
            "patch_size": {"height": PATCH, "width": PATCH},
            "resample": 3,
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711],
            "do_convert_rgb": True,
        }
        proc = {
            "processor_class": "PixtralProcessor",
            "patch_size": PATCH,
            "spatial_merge_size": 2,
            "image_token": "[IMG]",
            "image_break_token": "[IMG_BREAK]",
            "image_end_token": "[IMG_END]",
        }
    _write_json(dest / "preprocessor_config.json", pre)
    _write_json(dest / "processor_config.json", proc)


def _tokenizer_files(family: str, dest: pathlib.Path, tok) -> None:
    tok.save(str(dest / "tokenizer.json"))
    if family == "gemma3":
        specials = {k: _GEMMA_TOKENS[k] for k in ("bos_token", "eos_token", "pad_token")}
        extra = {k: _GEMMA_TOKENS[k] for k in ("boi_token", "eoi_token", "image_token")}
        config = {**specials, "extra_special_tokens": extra, "chat_template": GEMMA3_TEMPLATE}
    else:
        specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
        config = {**specials, "pad_token": "<unk>", "chat_template": MISTRAL3_TEMPLATE}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **config,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
    }
    _write_json(dest / "tokenizer_config.json", config)


def _weights(family: str, config: dict, seed: int) -> dict[str, mx.array]:
    """Parameters of mlx-vlm's own model class for `config`, drawn with `seed`, rescaled."""
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    model_class, _ = get_model_and_args(config=config)
    cfg = json.loads(json.dumps(config))  # from_dict may edit the nested dicts
    model_config = model_class.ModelConfig.from_dict(cfg)
    model_config = update_module_configs(
        model_config, model_class, cfg, ["text", "vision", "projector"]
    )
    mx.random.seed(seed)
    model = model_class.Model(model_config)
    out = {}
    for key, value in tree_flatten(model.parameters()):
        if family == "gemma3" and key.endswith("lm_head.weight"):
            continue  # tied to the embeddings, as in real Gemma 3 checkpoints
        if "multi_modal_projector" in key and value.ndim >= 2:
            if key.endswith("mm_input_projection_weight"):
                # mlx-vlm starts this at all ones: every image would project alike.
                value = mx.random.normal(value.shape) / value.shape[0] ** 0.5
            value = value * _PROJECTOR_GAIN
        elif value.ndim >= 2 and "embed" not in key and "norm" not in key:
            value = value * _GAIN
        out[key] = value.astype(mx.float32)
    return out


def _drawn_weights(config: dict, seed: int, dtype: str):
    """(name, lazy array) for mlx-vlm's model class of `config` at real sizes: every matrix
    drawn afresh, N(0, 1/fan_in), in `dtype`; vectors (norms, biases) as the class makes them.
    The class's own initial matrices are never evaluated: nothing is materialised until the
    writer evaluates one shard, so an 8 GB model never sits in memory whole, nor in float32."""
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    model_class, _ = get_model_and_args(config=config)
    cfg = json.loads(json.dumps(config))
    model_config = update_module_configs(
        model_class.ModelConfig.from_dict(cfg), model_class, cfg, ["text", "vision", "projector"]
    )
    mx.random.seed(seed)
    model = model_class.Model(model_config)
    dt = getattr(mx, dtype)
    for key, value in tree_flatten(model.parameters()):
        if key.endswith("lm_head.weight") and config["model_type"] == "gemma3":
            continue  # tied to the embeddings
        if value.ndim < 2:
            yield key, value.astype(dt)
        else:
            fan_in = int(np.prod(value.shape[1:]))
            yield key, mx.random.normal(value.shape, dtype=dt, scale=fan_in**-0.5)


def _save_one_file(dest: pathlib.Path, weights) -> None:
    mx.save_safetensors(str(dest / "model.safetensors"), dict(weights), metadata={"format": "mlx"})


def _write_json(path: pathlib.Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def build_vlm(
    dest: pathlib.Path,
    family: str,
    seed: int = 0,
    *,
    sizes: dict | None = None,
    write_weights=None,
) -> pathlib.Path:
    """Write a tiny `family` (one of FAMILIES) vision-language folder at `dest`; return it.

    `sizes` makes it another size: {"text": text_config fields, "vision": vision_config
    fields, "top": top-level config fields (e.g. mm_tokens_per_image), "vocab_size": n,
    "dtype": "bfloat16"}; its weights are then drawn per matrix (_drawn_weights), not the
    tiny gains. `write_weights(dest, pairs)` writes (name, lazy array) pairs (default: one
    model.safetensors; pass a shard writer for large sizes).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; use one of {FAMILIES}")
    dest = pathlib.Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    sizes = sizes or {}
    tok = _tokenizer(family, sizes.get("vocab_size"))
    config = _config(family, tok)
    if sizes:
        config["text_config"].update(sizes.get("text", {}))
        config["vision_config"].update(sizes.get("vision", {}))
        config.update(sizes.get("top", {}), torch_dtype=sizes.get("dtype", "float32"))
    _write_json(dest / "config.json", config)
    eos = config["eos_token_id"]
    _write_json(
        dest / "generation_config.json",
        {"bos_token_id": config["bos_token_id"], "eos_token_id": eos, "do_sample": False},
    )
    if sizes:
        weights = _drawn_weights(config, seed, config["torch_dtype"])
    else:
        weights = _weights(family, config, seed).items()
    (write_weights or _save_one_file)(dest, weights)
    _tokenizer_files(family, dest, tok)
    image_px = config["vision_config"]["image_size"]
    _processor_files(family, dest, image_px, config.get("mm_tokens_per_image", 4))
    return dest


def image_token_id(path: pathlib.Path) -> int:
    """The token id the processor repeats once per image feature."""
    config = json.loads((pathlib.Path(path) / "config.json").read_text())
    return config.get("image_token_index", config.get("image_token_id"))


def image(seed: int, size: tuple[int, int] = (IMAGE_PX, IMAGE_PX)) -> Image.Image:
    """A deterministic RGB test image of `size` (width, height): random pixels."""
    width, height = size
    pixels = np.random.RandomState(seed).randint(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


def oracle(
    path: pathlib.Path, messages: list[dict], images: list, max_tokens: int, **kw
) -> tuple[list[int], list[int]]:
    """mlx-vlm's own greedy generation for a chat: (prompt input ids, generated token ids).
    `kw` goes to mlx-vlm's generate_step (logit_bias, repetition_penalty, ...).

    The prompt goes through mlx-vlm's template helper and `prepare_inputs` (the processor),
    then `stream_generate` at temperature 0, as `mlx_vlm.generate` does. It stops at an end
    token as mlx-vlm does (that token is the list's last), so the list can be shorter than
    `max_tokens`.
    """
    import mlx_vlm
    from mlx_vlm.generate import stream_generate
    from mlx_vlm.prompt_utils import get_chat_template
    from mlx_vlm.utils import prepare_inputs, should_add_special_tokens

    model, processor = mlx_vlm.load(str(path))
    prompt = get_chat_template(processor, messages, add_generation_prompt=True)
    inputs = prepare_inputs(
        processor,
        images=list(images) or None,
        prompts=prompt,
        image_token_index=getattr(model.config, "image_token_index", None),
        add_special_tokens=should_add_special_tokens(model.config.model_type, processor),
    )
    extra = {
        k: v for k, v in inputs.items() if k not in ("input_ids", "pixel_values", "attention_mask")
    }
    input_ids = inputs["input_ids"]
    results = list(
        stream_generate(
            model,
            processor,
            prompt,
            input_ids=input_ids,
            pixel_values=inputs.get("pixel_values"),
            mask=inputs.get("attention_mask"),
            max_tokens=max_tokens,
            temperature=0.0,
            **extra,
            **kw,
        )
    )
    # The last result carries every generated id, the end token that stopped it included.
    return input_ids[0].tolist(), list(results[-1].token_ids or [])
