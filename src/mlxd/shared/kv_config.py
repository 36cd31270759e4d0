"""What a model's caches hold per layer, read from its config.json the way mlx-lm builds them.

Pure (no MLX): the supervisor's fit report plans with it before a model is loaded; a running
worker measures its own caches instead (worker/kv/cost.py), and the worker falls back to this
only when a cache kind is new to it. Per family:
- full attention: K and V per KV head per token (`head_dim`, or `v_head_dim` for V where the
  two differ; DeepSeek-V2 caches K of qk_nope + qk_rope dims for every head);
- MLA latents (DeepSeek-V3, Kimi K2, GLM-4.7-Flash ...): one "head" per layer holding the
  compressed latent (`kv_lora_rank`) as K and the shared rope key (`qk_rope_head_dim`) as V;
- sliding windows (Gemma 3, gpt-oss, Cohere 2, EXAONE 4, Olmo 3 ...): layers named
  "sliding_attention" in `layer_types`, or all but every `sliding_window_pattern`-th layer,
  hold at most `sliding_window` positions;
- hybrids (Qwen3-Next / Qwen3.5, Nemotron-H, Granite 4 hybrid ...): only the attention layers
  of `layer_types`, `hybrid_override_pattern` / `layers_block_type` or
  `full_attention_interval` grow with tokens; the others hold a recurrent state per row: a conv
  tail at the float dtype and the state in float32 (gated delta and Mamba 2 sizes; another
  recurrent kind counts 0 here, and its worker measures it).
Not modelled (the worker measures them): layers that share another layer's KV (Gemma 3n and 4)
and per-layer head sizes (Gemma 4's global heads).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxd.shared.kv_math import KvCost

# MLA models whose mlx-lm class caches full per-head K and V, not the latent.
FULL_HEAD_MLA = frozenset({"deepseek_v2", "minicpm3"})
# Model types whose config names a window that mlx-lm's class does not keep (full caches).
NO_WINDOW = frozenset({"gemma2"})
# mlx-lm's defaults where a config leaves `sliding_window_pattern` out.
DEFAULT_PATTERN = {"gemma3_text": 6, "gemma3": 6, "cohere2": 4, "gemma4_text": 5, "gpt_oss": 2}
# mlx-lm's gemma4_text defaults for what a Gemma 4 config may leave out.
GEMMA4_DEFAULTS = {
    "model_type": "gemma4_text",
    "head_dim": 256,
    "global_head_dim": 512,
    "num_key_value_heads": 1,
    "sliding_window": 512,
    "sliding_window_pattern": 5,
    "num_kv_shared_layers": 20,
}
# How layer_types / layers_block_type name layers that are not full attention; a name not
# here counts as full attention (never less than the cache holds).
SLIDING = frozenset({"sliding_attention", "local_attention"})
RECURRENT = frozenset({"linear_attention", "mamba", "conv", "recurrent"})
HOLDS_NOTHING = frozenset({"mlp", "moe"})
STATE_BYTES = 4  # recurrent states are float32 whatever the model's dtype


@dataclass(frozen=True)
class KvLayer:
    """One layer's cache: `kv_heads` x (`k_dim` + `v_dim`) per token (0 heads: none), at most
    `window` positions (0: no window); `state_elems` float32 and `tail_elems` float-dtype
    elements of recurrent state per row."""

    kv_heads: int = 0
    k_dim: int = 0
    v_dim: int = 0
    window: int = 0
    state_elems: int = 0
    tail_elems: int = 0

    def cost(self, dtype_bytes: int, kv_bits: int | None = None, group: int = 64) -> KvCost:
        """This layer's bytes (K and V quantized to `kv_bits` when set)."""
        per = self.kv_heads * (
            vector_bytes(self.k_dim, dtype_bytes, kv_bits, group)
            + vector_bytes(self.v_dim, dtype_bytes, kv_bits, group)
        )
        state = self.state_elems * STATE_BYTES + self.tail_elems * dtype_bytes
        if self.window:
            return KvCost(0, per, self.window, state)
        return KvCost(per, 0, 0, state)


def vector_bytes(dim: int, dtype_bytes: int, kv_bits: int | None, group: int) -> int:
    """One K or V vector: `dim` values at the dtype, or packed at `kv_bits` plus a scale and
    a bias (the float dtype) per `group` values, as mx.quantize stores them."""
    if kv_bits is None:
        return dim * dtype_bytes
    return dim * kv_bits // 8 + 2 * (dim // group) * dtype_bytes


@dataclass(frozen=True)
class KvLayout:
    """Every layer's cache, as the model's mlx-lm class makes them."""

    layers: tuple[KvLayer, ...]
    latent: bool = False  # MLA's compressed latent: its attention reads no quantized KV

    @classmethod
    def of_config(cls, config: dict) -> KvLayout | None:
        """From a config.json (multimodal wrappers nest it in text_config); None when it
        does not say."""
        cfg = config.get("text_config") or config
        if str(cfg.get("model_type") or config.get("model_type") or "").startswith("gemma4"):
            cfg = {**GEMMA4_DEFAULTS, **cfg}
        try:
            kinds = _layer_kinds(cfg)
            attention = _attention(cfg)
            latent = bool(cfg.get("kv_lora_rank") and cfg.get("qk_rope_head_dim"))
            latent = latent and cfg.get("model_type") not in FULL_HEAD_MLA
            layers = [_layer(kind, attention, cfg) for kind in kinds]
            return cls(tuple(_gemma4_layers(cfg, kinds, layers)), latent)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return None

    def cost(self, dtype_bytes: int, kv_bits: int | None = None, group: int = 64) -> KvCost:
        """What a row holds, at the float dtype or with K and V quantized."""
        total = KvCost(0)
        for layer in self.layers:
            total = total + layer.cost(dtype_bytes, kv_bits, group)
        return total

    @property
    def attention(self) -> list[KvLayer]:
        """The layers that hold K and V (full or windowed)."""
        return [x for x in self.layers if x.kv_heads]

    def counts(self) -> tuple[int, int, int]:
        """(full-attention, sliding-window, recurrent) layers."""
        windowed = sum(1 for x in self.attention if x.window)
        state = sum(1 for x in self.layers if x.state_elems or x.tail_elems)
        return len(self.attention) - windowed, windowed, state

    @property
    def quantizable(self) -> bool:
        """Whether kv_bits can apply: full attention layers, recurrent states beside them at
        most; not a window, not an MLA latent (worker/kv/scheme.py refuses those)."""
        attention = self.attention
        return bool(attention) and not self.latent and not any(x.window for x in attention)

    def dims(self) -> set[int]:
        """The K and V head dims (a quantization group must divide each)."""
        return {d for x in self.attention for d in (x.k_dim, x.v_dim)}


def kv_cost_of_config(
    config: dict, dtype_bytes: int, kv_bits: int | None = None, group_size: int = 64
) -> KvCost | None:
    """What a row holds, from a model's config.json (None when it does not say)."""
    layout = KvLayout.of_config(config)
    return None if layout is None else layout.cost(dtype_bytes, kv_bits, group_size)


def kv_bytes_per_token(
    config: dict, dtype_bytes: int, kv_bits: int | None = None, group_size: int = 64
) -> int | None:
    """Full-attention K and V bytes one token adds over all layers, from a config.json."""
    cost = kv_cost_of_config(config, dtype_bytes, kv_bits, group_size)
    return None if cost is None else cost.per_token


def _layer_kinds(cfg: dict) -> list[str]:
    """ "full", "sliding", "state" or "none" for each layer."""
    n = int(cfg["num_hidden_layers"])
    pattern = cfg.get("hybrid_override_pattern")  # Nemotron-H: M mamba, * attention, - / E MLP
    if pattern:
        return [
            {"*": "full", "M": "state"}.get(c, "none")
            for c in (pattern if isinstance(pattern, list) else list(pattern))
        ]
    types = cfg.get("layers_block_type") or cfg.get("layer_types")
    if types:
        return [_kind_of(t, cfg) for t in types]
    full = cfg.get("full_attn_idxs")  # LFM2 without layer_types: these attend, the rest convolve
    if full is not None:
        attends = set(full)
        return ["full" if i in attends else "state" for i in range(n)]
    interval = cfg.get("full_attention_interval")  # Qwen3-Next, Qwen3.5: every k-th attends
    if interval:
        return ["state" if (i + 1) % int(interval) else "full" for i in range(n)]
    if not _window(cfg):
        return ["full"] * n
    local = cfg.get("sliding_window_pattern") or DEFAULT_PATTERN.get(cfg.get("model_type", ""))
    if isinstance(local, str):  # EXAONE 4: "LLLG", L local, G global, repeated
        return ["sliding" if local[i % len(local)] == "L" else "full" for i in range(n)]
    if local and int(local) > 1:  # Gemma 3, Cohere 2: every p-th layer attends to all
        p = int(local)
        return ["full" if i % p == p - 1 else "sliding" for i in range(n)]
    return ["full"] * n  # a window in the config alone (Mistral): mlx-lm keeps full caches


def _kind_of(name: str, cfg: dict) -> str:
    if name in SLIDING:
        return "sliding" if _window(cfg) else "full"
    if name in RECURRENT:
        return "state"
    return "none" if name in HOLDS_NOTHING else "full"


def _window(cfg: dict) -> int:
    """The sliding window mlx-lm keeps (0: none)."""
    if cfg.get("model_type") in NO_WINDOW or cfg.get("use_sliding_window") is False:
        return 0
    return int(cfg.get("sliding_window") or cfg.get("sliding_window_size") or 0)


def _attention(cfg: dict) -> KvLayer:
    """An attention layer's cache (full; windows are set per layer)."""
    if cfg.get("kv_lora_rank") and cfg.get("qk_rope_head_dim"):
        rope = int(cfg["qk_rope_head_dim"])
        if cfg.get("model_type") in FULL_HEAD_MLA:
            heads = int(cfg["num_attention_heads"])
            k = int(cfg["qk_nope_head_dim"]) + rope
            return KvLayer(heads, k, int(cfg.get("v_head_dim") or k))
        return KvLayer(1, int(cfg["kv_lora_rank"]), rope)  # the latent and the rope key
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    k = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    return KvLayer(kv_heads, k, int(cfg.get("v_head_dim") or k))


def _layer(kind: str, attention: KvLayer, cfg: dict) -> KvLayer:
    if kind == "full":
        return attention
    if kind == "sliding":
        return KvLayer(attention.kv_heads, attention.k_dim, attention.v_dim, _window(cfg))
    if kind == "state":
        return _recurrent(cfg)
    return KvLayer()


def _gemma4_layers(cfg: dict, kinds: list[str], layers: list[KvLayer]) -> list[KvLayer]:
    """Gemma 4's: full-attention layers with their own head size (`global_head_dim`; with
    K-eq-V their own head count), and the last `num_kv_shared_layers` reading earlier
    layers' K and V, holding none (mlx-lm makes no cache for them; a gemma4 config that
    leaves the count out has mlx-lm's 20 from GEMMA4_DEFAULTS). Other configs pass through
    unchanged."""
    out = list(layers)
    if cfg.get("global_head_dim"):
        heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
        if cfg.get("attention_k_eq_v") and cfg.get("num_global_key_value_heads"):
            heads = int(cfg["num_global_key_value_heads"])
        dim = int(cfg["global_head_dim"])
        out = [KvLayer(heads, dim, dim) if kind == "full" else x for kind, x in zip(kinds, out)]
    first = len(out) - int(cfg.get("num_kv_shared_layers") or 0)
    if 0 < first < len(out):
        out[first:] = [KvLayer()] * (len(out) - first)
    return out


def _recurrent(cfg: dict) -> KvLayer:
    """A recurrent layer's state per row: (conv kernel - 1) x conv channels at the dtype, and
    the state in float32."""
    if cfg.get("linear_num_value_heads"):  # gated delta (Qwen3-Next, Qwen3.5)
        hk, dk = int(cfg["linear_num_key_heads"]), int(cfg["linear_key_head_dim"])
        hv, dv = int(cfg["linear_num_value_heads"]), int(cfg["linear_value_head_dim"])
        conv = (int(cfg["linear_conv_kernel_dim"]) - 1) * (2 * hk * dk + hv * dv)
        return KvLayer(state_elems=hv * dv * dk, tail_elems=conv)
    if cfg.get("conv_L_cache"):  # LFM2's short convolutions: the last L-1 inputs
        return KvLayer(tail_elems=(int(cfg["conv_L_cache"]) - 1) * int(cfg["hidden_size"]))
    mamba = _mamba(cfg)
    if mamba is None:
        return KvLayer()  # a recurrent kind not modelled here: its worker measures it
    heads, head_dim, n, kernel, groups = mamba
    conv = (kernel - 1) * (heads * head_dim + 2 * groups * n)
    return KvLayer(state_elems=heads * head_dim * n, tail_elems=conv)


def _mamba(cfg: dict) -> tuple[int, int, int, int, int] | None:
    """Mamba 2's (heads, head dim, state size, conv kernel, groups) as Nemotron-H or Granite
    hybrid name them."""
    if cfg.get("mamba_num_heads"):  # Nemotron-H
        keys = ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "conv_kernel", "n_groups")
    elif cfg.get("mamba_n_heads"):  # Granite 4 hybrid
        keys = ("mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_d_conv", "mamba_n_groups")
    else:
        return None
    heads, head_dim, n = (int(cfg[k]) for k in keys[:3])
    return heads, head_dim, n, int(cfg.get(keys[3]) or 4), int(cfg.get(keys[4]) or 1)
