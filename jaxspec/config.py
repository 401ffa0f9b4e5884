"""ModelConfig: the static shape of a Llama-family decoder (frozen, hashable, safe as a jit static arg)."""
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
    architecture: str = "llama"

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

    @property
    def num_params(self) -> int:
        E, F, V, L = self.hidden_size, self.intermediate_size, self.vocab_size, self.num_layers
        H, G, D = self.num_heads, self.num_kv_heads, self.head_dim
        per_layer = E * (H + 2 * G) * D + H * D * E + 3 * E * F + 2 * E
        if self.qkv_bias:
            per_layer += (H + 2 * G) * D
        head = 0 if self.tie_word_embeddings else E * V
        return V * E + L * per_layer + E + head

    @classmethod
    def from_gguf(cls, fields: dict[str, Any]) -> "ModelConfig":
        """From GGUF metadata (`{key: value}`), architectures llama and qwen2."""
        arch = fields.get("general.architecture")
        if arch not in ("llama", "qwen2"):
            raise ValueError(f"unsupported GGUF architecture {arch!r}: jaxspec reads 'llama' and 'qwen2'")

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
        return cls(
            vocab_size=int(vocab),
            hidden_size=E,
            intermediate_size=int(get("feed_forward_length")),
            num_layers=int(get("block_count")),
            num_heads=H,
            num_kv_heads=int(get("attention.head_count_kv", H)),
            head_dim=int(get("rope.dimension_count", E // H)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
            max_position_embeddings=int(get("context_length", 2048)),
            tie_word_embeddings=False,  # decided by the loader: tied when output.weight is absent
            qkv_bias=arch == "qwen2",
            architecture=arch,
        )

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """From a Hugging Face config.json dict (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)."""
        mtype = cfg.get("model_type")
        if mtype not in ("llama", "mistral", "qwen2"):
            raise ValueError(f"unsupported model_type {mtype!r} in config.json: "
                             "jaxspec reads llama, mistral and qwen2")
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
