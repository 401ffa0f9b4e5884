"""A decoder's weights as a Flax NNX module, for the models jaxspec trains (the distilled draft model).

LlamaModule(cfg, params) wraps a params pytree (models/llama.py layout) as nnx.Param leaves; calling
it runs the same pure forward. The frozen target stays a plain pytree (Model.params).
"""
from __future__ import annotations

import jax
from flax import nnx

from ..cache import KVCache
from ..config import ModelConfig
from .llama import forward


class LlamaModule(nnx.Module):
    """A Llama-family decoder's weights as nnx.Param leaves of the params pytree."""

    def __init__(self, cfg: ModelConfig, params):
        self.cfg = cfg
        self.weights = nnx.data(jax.tree_util.tree_map(nnx.Param, params))

    def params(self):
        """The params pytree (models/llama.py layout) of plain arrays."""
        return jax.tree_util.tree_map(lambda v: v[...], self.weights, is_leaf=lambda x: isinstance(x, nnx.Variable))

    def __call__(self, tokens: jax.Array, cache: KVCache, hidden_layers: tuple[int, ...] = (), live=None, tree=None):
        """tokens int32[B, T] -> (logits float32[B, T, V], hidden [N, B, T, E], cache with length += T);
        tree: models.forward's."""
        return forward(self.params(), tokens, cache, self.cfg, hidden_layers, live, tree)
