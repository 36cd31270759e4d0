"""Deterministic tiny random-weight model for tests.

`build_tiny_model(dest)` writes an mlx-lm model folder (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json) that
`mlx_lm.load(str(dest))` opens offline. The weights are random, so the text is nonsense, but
everything a serving path touches is real: a byte-level BPE tokenizer, ChatML special tokens,
a Qwen2.5-style chat template with tools, and a real llama / qwen3 architecture.

Same arguments give byte-identical files, and a build takes well under a second.
Plain module (no pytest) so benchmarks and scripts can use it too.
"""

from __future__ import annotations

import json
import pathlib
import random

import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer

VOCAB_SIZE = 2048
HIDDEN = 256
LAYERS = 4
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 768
MAX_POSITIONS = 4096

# Special tokens never appear in decoded text; the markers below stay visible (Qwen does the
# same), so reasoning and tool-call parsers can find them in the output.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKER_TOKENS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]

CHAT_TEMPLATE = """\
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is not none -%}
{%- for part in content if part.type == 'text' -%}{{ part.text }}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- text(messages[0].content) + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and ' }}
{{- 'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages and messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'tool' %}
{%- if loop.first or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + text(message.content) + '\\n</tool_response>' }}
{%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
{%- if message.reasoning_content %}
{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}
{%- endif %}
{{- text(message.content) }}
{%- for tool_call in message.tool_calls or [] %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{%- if not loop.first or message.content %}{{- '\\n' }}{%- endif %}
{{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
{%- if tool_call.arguments is string %}{{- tool_call.arguments }}
{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
{%- endif %}
"""

# A template that opens <think> in the generation prompt (DeepSeek-R1 / QwQ style): the output
# starts inside reasoning unless enable_thinking is false.
_CLOSED = "{%- if enable_thinking is defined and enable_thinking is false %}"
OPEN_THINK_TEMPLATE = CHAT_TEMPLATE.replace(
    _CLOSED + "\n{{- '<think>\\n\\n</think>\\n\\n' }}\n{%- endif %}",
    _CLOSED + "\n{{- '<think>\\n\\n</think>\\n\\n' }}\n{%- else %}{{- '<think>\\n' }}{%- endif %}",
)

_TEXT = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with one step.
Hello, world! How are you today? I'm fine, thanks; and you? Let's meet at 10:30 on Monday.
In 1969, astronauts walked on the Moon. The trip took about 3 days and 4 hours each way.
Water boils at 100 degrees Celsius (212 degrees Fahrenheit) at sea level.
She said: "Please bring 2 apples, 3 pears and 12 eggs." He replied, "Sure, no problem!"
The weather in Paris is sunny, with a high of 24 and a low of 15 degrees.
Prices rose by 3.5% in March, then fell by 1.2% in April; analysts were surprised.
Python, Rust and Go are programming languages. def add(a, b): return a + b
Error: file not found (code 404). Retry in 5 seconds... Done!
The model reads a prompt, predicts the next token, and repeats until it sees a stop token.
Call get_weather with {"city": "London", "unit": "celsius"} to check the forecast.
{"name": "search", "arguments": {"query": "best pizza near me", "limit": 5}}
Café, naïve, résumé and jalapeño are words with accents. Emoji like 😀 and 🚀 are bytes too.
Q: What is 7 times 8? A: 56. Q: What is the square root of 144? A: 12.
Dear team, the meeting has moved to Thursday at 2 pm. Best regards, Alice.
Step 1: open the box. Step 2: remove the cable. Step 3: plug it in and wait.
"""

_WORDS = """\
time person year way day thing man world life hand part child eye woman place work week case
point government company number group problem fact house water money story book city river
mountain forest ocean music table window door light system question answer server model
memory token request response cache process thread socket network engine queue stream
good new first last long great little own other old right big high different small large
next early young important few public bad same able quick slow happy bright dark warm cold
run walk read write think know take see come want look use find give tell ask work seem feel
try leave call keep begin help show hear play move live believe bring happen build send
stop load serve wait start learn change follow create speak open close grow offer remember
""".split()
_SUFFIXES = ["", "", "", "s", "ed", "ing", "er", "ly", "ness", "able"]


def _corpus() -> list[str]:
    """Fixed English text plus generated sentences; enough distinct words to fill the vocab."""
    rng = random.Random(1234)
    lines = _TEXT.splitlines()
    for i in range(300):
        # Inflections multiply the distinct words, which the merges need to reach VOCAB_SIZE.
        words = [rng.choice(_WORDS) + rng.choice(_SUFFIXES) for _ in range(rng.randint(4, 12))]
        words[0] = words[0].capitalize()
        number = rng.choice([str(i), f"{rng.randint(0, 9999)}", f"{rng.random() * 100:.2f}"])
        end = rng.choice([".", "!", "?", ";", ":", ","])
        lines.append(f"{' '.join(words)} {number}{end}")
    return lines


def _build_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    n_added = len(SPECIAL_TOKENS) + len(MARKER_TOKENS)
    trainer = BpeTrainer(
        vocab_size=VOCAB_SIZE - n_added,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    # Added after training so they sit at the end of the vocab, as in Qwen checkpoints.
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKER_TOKENS])
    return tokenizer


def _model_config(arch: str, vocab_size: int, eos_id: int, bos_id: int) -> dict:
    if arch not in ("llama", "qwen3"):
        raise ValueError(f"unsupported arch {arch!r}; use 'llama' or 'qwen3'")
    return {
        "architectures": ["LlamaForCausalLM" if arch == "llama" else "Qwen3ForCausalLM"],
        "model_type": arch,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "rope_theta": 10000.0,
        "max_position_embeddings": MAX_POSITIONS,
        "tie_word_embeddings": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


def _weights(arch: str, vocab_size: int, seed: int) -> dict[str, np.ndarray]:
    # RandomState's stream is frozen across numpy versions, unlike default_rng's.
    rng = np.random.RandomState(seed)

    def normal(*shape: int, std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    # Layer weights are large next to the tied embeddings: with small ones the residual stream
    # is the input embedding and greedy decoding just repeats the last token.
    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal(vocab_size, HIDDEN, std=0.05)}
    shapes = {
        "self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN),
        "self_attn.k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
        "self_attn.v_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
        "self_attn.o_proj": (HIDDEN, HEADS * HEAD_DIM),
        "mlp.gate_proj": (INTERMEDIATE, HIDDEN),
        "mlp.up_proj": (INTERMEDIATE, HIDDEN),
        "mlp.down_proj": (HIDDEN, INTERMEDIATE),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for name, shape in shapes.items():
            w[f"{p}{name}.weight"] = normal(*shape, std=0.08)
        w[f"{p}input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        w[f"{p}post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        if arch == "qwen3":
            w[f"{p}self_attn.q_norm.weight"] = np.ones(HEAD_DIM, np.float32)
            w[f"{p}self_attn.k_norm.weight"] = np.ones(HEAD_DIM, np.float32)
    w["model.norm.weight"] = np.ones(HIDDEN, np.float32)
    return w


def _write_json(path: pathlib.Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def build_tiny_model(
    dest: pathlib.Path,
    arch: str = "llama",
    seed: int = 0,
    chat_template: str | None = None,
) -> pathlib.Path:
    """Write a tiny deterministic model folder at `dest` and return `dest`.

    `arch` is "llama" or "qwen3"; `seed` picks the random weights (the tokenizer never
    changes); `chat_template` replaces the default ChatML template, and "" writes none.
    """
    dest = pathlib.Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer()
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    eos_id = tokenizer.token_to_id("<|im_end|>")
    eot_id = tokenizer.token_to_id("<|endoftext|>")

    _write_json(dest / "config.json", _model_config(arch, vocab_size, eos_id, eot_id))
    # Like Qwen instruct models: a chat turn ends at <|im_end|>, raw text at <|endoftext|>.
    _write_json(
        dest / "generation_config.json", {"bos_token_id": eot_id, "eos_token_id": [eos_id, eot_id]}
    )
    save_file(
        _weights(arch, vocab_size, seed), str(dest / "model.safetensors"), metadata={"format": "pt"}
    )

    tokenizer.save(str(dest / "tokenizer.json"))
    specials = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "additional_special_tokens": SPECIAL_TOKENS[1:],
    }
    template = CHAT_TEMPLATE if chat_template is None else chat_template
    if template:
        tokenizer_config["chat_template"] = template
    _write_json(dest / "tokenizer_config.json", tokenizer_config)
    _write_json(
        dest / "special_tokens_map.json",
        {
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "additional_special_tokens": SPECIAL_TOKENS[1:],
        },
    )
    return dest


def build_tiny_embedding_model(dest: pathlib.Path, seed: int = 2) -> pathlib.Path:
    """A tiny Qwen3-Embedding-style folder at `dest`: what the official checkpoints look like.

    A qwen3 config, sentence-transformers files (`modules.json`, `1_Pooling/config.json`
    with last-token pooling, a Normalize module), a tokenizer that appends <|endoftext|> to
    every text, and backbone weights with flat keys (`layers.0...`, no `model.` prefix) and
    no language-model head although the config is untied (as Qwen3-Embedding-8B ships).
    """
    dest = pathlib.Path(dest)
    build_tiny_model(dest, arch="qwen3", seed=seed, chat_template="")
    config = json.loads((dest / "config.json").read_text())
    config["tie_word_embeddings"] = False
    _write_json(dest / "config.json", config)
    weights = _weights("qwen3", config["vocab_size"], seed)
    flat = {k.removeprefix("model."): v for k, v in weights.items()}
    save_file(flat, str(dest / "model.safetensors"), metadata={"format": "pt"})

    tokenizer = Tokenizer.from_file(str(dest / "tokenizer.json"))
    eot = tokenizer.token_to_id("<|endoftext|>")
    tokenizer.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", eot)]
            ),
        ]
    )
    tokenizer.save(str(dest / "tokenizer.json"))

    modules = [
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (path, kind) in enumerate(
            [("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize")]
        )
    ]
    (dest / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (dest / "1_Pooling").mkdir(exist_ok=True)
    _write_json(
        dest / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": HIDDEN,
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": False,
            "pooling_mode_max_tokens": False,
            "pooling_mode_lasttoken": True,
            "include_prompt": True,
        },
    )
    (dest / "2_Normalize").mkdir(exist_ok=True)
    return dest
