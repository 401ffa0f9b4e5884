"""Gemma 3's decoder layer (Gemma Team 2025, "Gemma 3 Technical Report"): RMSNorm before and after
attention and before and after the MLP, RMSNorm on queries and keys, a tanh-GELU gated MLP. The rest
of the model (scaled embeddings, local layers with a sliding window and their own RoPE base, tied
output) is in models/llama.py's forward, switched by ModelConfig. Norm weights are kept as the
factor they multiply by (Gemma's 1 + w, as GGUF files store them)."""
from __future__ import annotations

import functools

import jax

from ..cache import KVCache
from ..config import ModelConfig
from .llama import attention, mlp, rms_norm

gelu_tanh = functools.partial(jax.nn.gelu, approximate=True)


def gemma_block(cfg: ModelConfig, x, cache: KVCache, p, layer, pos, cos, sin, mask, live=None, window=0):
    """One Gemma 3 layer on x [B, T, E]; writes this layer's keys/values into the cache."""
    eps = cfg.rms_norm_eps
    out, cache = attention(cfg, rms_norm(x, p["attn_norm"], eps), cache, p, layer, pos, cos, sin, mask, live,
                           window)
    x = x + rms_norm(out, p["post_attn_norm"], eps)
    h = mlp(rms_norm(x, p["mlp_norm"], eps), p, gelu_tanh)
    return x + rms_norm(h, p["post_mlp_norm"], eps), cache
