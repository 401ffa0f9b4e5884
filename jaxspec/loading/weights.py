"""Assemble the params pytree (see models/llama.py) from per-tensor readers in torch layout."""
from __future__ import annotations

from typing import Callable, Optional

import jax.numpy as jnp
import numpy as np

from ..config import ModelConfig

# A reader returns one tensor in Hugging Face / torch layout (Linear weights are [out, in]),
# or None when absent. Canonical names: embed, norm, lm_head and per layer attn_norm, q, k, v,
# o, bq, bk, bv, mlp_norm, gate, up, down (Gemma 3: q_norm, k_norm, post_attn_norm, post_mlp_norm).
Reader = Callable[[str, Optional[int]], Optional[np.ndarray]]


def _need(read: Reader, name: str, layer: Optional[int] = None) -> np.ndarray:
    t = read(name, layer)
    if t is None:
        where = f" of layer {layer}" if layer is not None else ""
        raise ValueError(f"checkpoint lacks tensor {name!r}{where}")
    return np.asarray(t, np.float32)


def _check(t: np.ndarray, shape: tuple, what: str) -> np.ndarray:
    if t.shape != shape:
        raise ValueError(f"tensor {what} has shape {t.shape}, config expects {shape}")
    return t


def assemble_params(cfg: ModelConfig, read: Reader, dtype=jnp.float32) -> dict:
    """Per-layer tensors in the einsum layouts of models/llama.py; layers as a tuple of L dicts."""
    E, F, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
    H, G, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    def per_layer(name, shape, convert):
        return [convert(_check(_need(read, name, i), shape, f"{name}[{i}]")) for i in range(L)]

    layers = {
        "attn_norm": per_layer("attn_norm", (E,), lambda t: t),
        "wq": per_layer("q", (H * D, E), lambda t: t.T.reshape(E, H, D)),
        "wk": per_layer("k", (G * D, E), lambda t: t.T.reshape(E, G, D)),
        "wv": per_layer("v", (G * D, E), lambda t: t.T.reshape(E, G, D)),
        "wo": per_layer("o", (E, H * D), lambda t: t.T.reshape(H, D, E)),
        "mlp_norm": per_layer("mlp_norm", (E,), lambda t: t),
        "w_gate": per_layer("gate", (F, E), lambda t: t.T),
        "w_up": per_layer("up", (F, E), lambda t: t.T),
        "w_down": per_layer("down", (E, F), lambda t: t.T),
    }
    if cfg.gemma:                              # norm weights as the factor they multiply by (1 + w)
        layers.update({name: per_layer(name, (D,), lambda t: t) for name in ("q_norm", "k_norm")})
        layers.update({name: per_layer(name, (E,), lambda t: t) for name in ("post_attn_norm", "post_mlp_norm")})
    if cfg.qkv_bias:
        layers["bq"] = per_layer("bq", (H * D,), lambda t: t.reshape(H, D))
        layers["bk"] = per_layer("bk", (G * D,), lambda t: t.reshape(G, D))
        layers["bv"] = per_layer("bv", (G * D,), lambda t: t.reshape(G, D))
    params = {
        "embed": _check(_need(read, "embed"), (V, E), "embed"),
        "norm": _check(_need(read, "norm"), (E,), "norm"),
        "layers": tuple({k: v[i] for k, v in layers.items()} for i in range(L)),
    }
    if not cfg.tie_word_embeddings:
        params["lm_head"] = _check(_need(read, "lm_head"), (V, E), "lm_head").T
    return _to_device(params, dtype)


def _to_device(tree, dtype):
    if isinstance(tree, dict):
        return {k: _to_device(v, dtype) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_to_device(v, dtype) for v in tree)
    return jnp.asarray(tree, dtype)
