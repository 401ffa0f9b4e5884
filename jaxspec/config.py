"""ModelConfig: the static shape of a decoder (frozen, hashable, safe as a jit static arg): the Llama
family (Llama, Mistral, Qwen2, SmolLM2) and Gemma 3."""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Llama-family decoder hyper-parameters. Shape letters: L layers, E width, F MLP width,
    H query heads, G key/value heads, D head dim, V vocabulary."""

    vocab_size: int            # V
    hidden_size: int           # E
    intermediate_size: int     # F
    num_layers: int            # L
    num_heads: int             # H
    num_kv_heads: int          # G
    head_dim: int              # D
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False     # Qwen2-style biases on q, k, v projections
    architecture: str = "llama"   # "gemma3": scaled embeddings, q/k norms, norms after attention and MLP,
                                  # tanh-GELU MLP (models/gemma.py)
    local_layers: tuple = ()   # layers whose attention sees only the last sliding_window positions
    sliding_window: int = 0    # keys a local layer's query sees, itself included
    rope_local_theta: float = 10000.0   # RoPE base of the local layers
    query_scale: float = 0.0   # attention scores' scale; 0: 1 / sqrt(D) (Gemma: query_pre_attn_scalar^-1/2)

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {self.architecture!r}")
        if any(not 0 <= i < self.num_layers for i in self.local_layers) or (self.local_layers and
                                                                           self.sliding_window < 1):
            raise ValueError(f"local_layers {self.local_layers} must lie in [0, {self.num_layers}) and need "
                             f"sliding_window >= 1 (got {self.sliding_window})")

    @property
    def gemma(self) -> bool:
        return self.architecture == "gemma3"

    @property
    def scale(self) -> float:
        """The attention scores' scale."""
        return self.query_scale or self.head_dim ** -0.5

    @property
    def num_params(self) -> int:
        E, F, V, L = self.hidden_size, self.intermediate_size, self.vocab_size, self.num_layers
        H, G, D = self.num_heads, self.num_kv_heads, self.head_dim
        per_layer = E * (H + 2 * G) * D + H * D * E + 3 * E * F + 2 * E
        if self.qkv_bias:
            per_layer += (H + 2 * G) * D
        if self.gemma:                                    # q/k norms, norms after attention and MLP
            per_layer += 2 * D + 2 * E
        head = 0 if self.tie_word_embeddings else E * V
        return V * E + L * per_layer + E + head

    @classmethod
    def from_gguf(cls, fields: dict[str, Any]) -> "ModelConfig":
        """From GGUF metadata (`{key: value}`), architectures llama, qwen2 and gemma3."""
        arch = fields.get("general.architecture")
        if arch not in ("llama", "qwen2", "gemma3"):
            raise ValueError(f"unsupported GGUF architecture {arch!r}: jaxspec reads 'llama', 'qwen2' and 'gemma3'")

        def get(key, default=None):
            full = f"{arch}.{key}"
            if full in fields:
                return fields[full]
            if default is None:
                raise ValueError(f"GGUF metadata lacks {full!r}")
            return default

        E = int(get("embedding_length"))
        H = int(get("attention.head_count"))
        vocab = fields.get(f"{arch}.vocab_size")
        if vocab is None:
            vocab = len(fields.get("tokenizer.ggml.tokens", ()))
        L = int(get("block_count"))
        cfg = cls(
            vocab_size=int(vocab),
            hidden_size=E,
            intermediate_size=int(get("feed_forward_length")),
            num_layers=L,
            num_heads=H,
            num_kv_heads=int(get("attention.head_count_kv", H)),
            head_dim=int(get("rope.dimension_count", get("attention.key_length", E // H))),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
            max_position_embeddings=int(get("context_length", 2048)),
            tie_word_embeddings=False,  # decided by the loader: tied when output.weight is absent
            qkv_bias=arch == "qwen2",
            architecture=arch,
        )
        if arch != "gemma3":
            return cfg
        return dataclasses.replace(cfg, **gemma3_layers(L, int(get("attention.sliding_window"))))

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """From a Hugging Face config.json dict (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)."""
        mtype = cfg.get("model_type")
        if mtype in ("gemma3_text", "gemma3"):
            return cls._from_hf_gemma3(cfg.get("text_config") or cfg)
        if mtype not in ("llama", "mistral", "qwen2"):
            raise ValueError(f"unsupported model_type {mtype!r} in config.json: "
                             "jaxspec reads llama, mistral, qwen2 and gemma3_text")
        if mtype != "qwen2" and cfg.get("attention_bias"):
            raise ValueError("attention_bias=True (bias on the output projection) is not supported")
        scaling = cfg.get("rope_scaling")
        if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            raise ValueError(f"unsupported rope_scaling {scaling!r}")
        E, H = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        theta = cfg.get("rope_theta")
        if theta is None:  # newer transformers nest it under rope_parameters
            theta = (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=E,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=H,
            num_kv_heads=int(cfg.get("num_key_value_heads") or H),
            head_dim=int(cfg.get("head_dim") or E // H),
            rope_theta=float(theta),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=mtype == "qwen2",
            architecture=mtype,
        )

    @classmethod
    def _from_hf_gemma3(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """A Gemma3TextConfig dict (transformers 4.50+: rope_theta and rope_local_base_freq; 5.x:
        rope_parameters per layer type). Refuses what the forward does not do: logit soft-capping,
        RoPE scaling, bidirectional attention."""
        for key in ("final_logit_softcapping", "attn_logit_softcapping"):
            if cfg.get(key):
                raise ValueError(f"unsupported {key}={cfg[key]} in config.json")
        L, rope = int(cfg["num_hidden_layers"]), cfg.get("rope_parameters") or {}
        full, local = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
        for kind in (full, local, cfg.get("rope_scaling") or {}):
            if kind.get("rope_type", kind.get("type", "default")) != "default":
                raise ValueError(f"unsupported RoPE scaling {kind!r} in config.json")
        if cfg.get("use_bidirectional_attention"):
            raise ValueError("unsupported use_bidirectional_attention=True in config.json")
        types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % int(cfg.get("sliding_window_pattern", 6))
                                           else "full_attention" for i in range(L)]
        H = int(cfg["num_attention_heads"])
        return cls(vocab_size=int(cfg["vocab_size"]), hidden_size=int(cfg["hidden_size"]),
                   intermediate_size=int(cfg["intermediate_size"]), num_layers=L, num_heads=H,
                   num_kv_heads=int(cfg.get("num_key_value_heads") or H), head_dim=int(cfg["head_dim"]),
                   rope_theta=float(full.get("rope_theta", cfg.get("rope_theta", 1e6))),
                   rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                   max_position_embeddings=int(cfg.get("max_position_embeddings", 32768)),
                   tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)), architecture="gemma3",
                   local_layers=tuple(i for i, t in enumerate(types) if t == "sliding_attention"),
                   sliding_window=int(cfg.get("sliding_window") or 0),
                   rope_local_theta=float(local.get("rope_theta", cfg.get("rope_local_base_freq", 10000.0))),
                   query_scale=float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5)


ARCHITECTURES = ("llama", "mistral", "qwen2", "gemma3")
GEMMA3_GLOBAL_EVERY = 6          # Gemma 3: every sixth layer attends globally, the other five locally


def gemma3_layers(num_layers: int, sliding_window: int, query_pre_attn_scalar: float = 256.0) -> dict:
    """Gemma 3's settings that GGUF metadata leaves out, at transformers' Gemma3TextConfig defaults:
    local (sliding-window) layers, RoPE base 10,000 for them, query_pre_attn_scalar 256."""
    local = tuple(i for i in range(num_layers) if (i + 1) % GEMMA3_GLOBAL_EVERY)
    return {"local_layers": local, "sliding_window": sliding_window, "rope_local_theta": 10000.0,
            "query_scale": query_pre_attn_scalar ** -0.5}
