"""Model: config + params + tokenizer, with a cache-free logits() for checks and scoring."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
import functools
import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from .cache import init_cache
from .config import ModelConfig
from .models import forward, unstack_layers


@functools.partial(jax.jit, static_argnames=("cfg",))
def _logits(params, ids, cfg):
    B, T = ids.shape
    cache = init_cache(cfg, B, T, params["embed"].dtype)
    return forward(params, ids, cache, cfg)[0]


@dataclasses.dataclass(repr=False)
class Model:
    config: ModelConfig
    params: dict
    tokenizer: object
    source: str = ""

    def __repr__(self):
        c, dtype = self.config, self.params["embed"].dtype
        size = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(self.params))
        return (f"Model({self.source or 'unnamed'}: {size / 1e6:.1f}M parameters, {c.num_layers} layers, width "
                f"{c.hidden_size}, {c.num_heads}/{c.num_kv_heads} heads, vocabulary {c.vocab_size}, {dtype})")

    def logits(self, ids: jax.Array | Sequence[int]) -> jax.Array:
        """int32[B, T] (or one list of ids) -> float32[B, T, V], causal, no cache kept."""
        ids = jnp.asarray(ids, jnp.int32)
        if ids.ndim == 1:
            ids = ids[None]
        if ids.ndim != 2 or ids.shape[1] == 0:
            raise ValueError(f"ids must be int32[B, T] with T >= 1, got shape {ids.shape}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size:
            raise ValueError(f"ids must lie in [0, {self.config.vocab_size}), got "
                             f"[{int(ids.min())}, {int(ids.max())}]")
        return _logits(self.params, ids, self.config)

    @functools.cached_property
    def fingerprint(self) -> str:
        """A short hash of the weights, to bind heads to their target: sha256 over every leaf's float32
        bytes in the stacked layout's leaf order, so per-layer and stacked params hash alike."""
        h = hashlib.sha256()
        layers = unstack_layers(self.params["layers"])
        for name in sorted(self.params):
            if name != "layers":
                h.update(np.asarray(self.params[name], np.float32).tobytes())
                continue
            for key in sorted(layers[0]):                 # a stacked leaf's bytes: its layers in order
                for p in layers:
                    h.update(np.asarray(p[key], np.float32).tobytes())
        return h.hexdigest()[:16]
