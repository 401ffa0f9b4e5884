"""An independent small draft model on the target's tokenizer, with its own static KV cache."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from ..cache import init_cache, rollback
from ..heads.metadata import HeadMetadata, head_metadata
from ..model import Model
from ..models.module import LlamaModule
from ..tree import Tree, frontier_inputs, grow_tree
from .base import Context, Drafter, Proposal, PyTree, TreeProposal, catch_up, sample_chain


def same_tokenizer(a, b) -> bool:
    """True when two tokenizers map the same strings to the same ids (same vocabulary table)."""
    if a is b:
        return True
    va, vb = getattr(a, "backend", None), getattr(b, "backend", None)
    if va is not None and vb is not None:
        return va.get_vocab(with_added_tokens=True) == vb.get_vocab(with_added_tokens=True)
    return type(a) is type(b) and getattr(a, "vocab_size", None) == getattr(b, "vocab_size", None)


def check_same_vocabulary(drafter_model: Model, target: Model, who: str) -> None:
    dv, tv = drafter_model.config.vocab_size, target.config.vocab_size
    if dv != tv:
        raise ValueError(f"{who} vocabulary size {dv} != target vocabulary size {tv}: "
                         "drafter and target must share one tokenizer")
    if not same_tokenizer(drafter_model.tokenizer, target.tokenizer):
        raise ValueError(f"{who} uses another tokenizer than the target: their token ids differ")


def truncated(model: Model, num_layers: int) -> Model:
    """The first num_layers decoder layers of `model` with its final norm and head: a cheap drafter."""
    if not 1 <= num_layers <= model.config.num_layers:
        raise ValueError(f"num_layers must lie in [1, {model.config.num_layers}], got {num_layers}")
    local = tuple(i for i in model.config.local_layers if i < num_layers)
    cfg = dataclasses.replace(model.config, num_layers=num_layers, local_layers=local,
                              sliding_window=model.config.sliding_window if local else 0)
    layers = model.params["layers"]
    layers = layers[:num_layers] if isinstance(layers, tuple) else \
        jax.tree_util.tree_map(lambda a: a[:num_layers], layers)
    params = {**model.params, "layers": layers}
    return Model(config=cfg, params=params, tokenizer=model.tokenizer,
                 source=f"{model.source}[:{num_layers} layers]")


class DraftModelState(NamedTuple):
    """The draft model's state between steps."""

    cache: object           # its KVCache, holding the same tokens as the target's
    written: jax.Array      # int32[B]: tokens in the cache that match the target's
    fed: jax.Array          # int32[]: drafts the last propose fed (the accepted ones are valid)


class DraftModel(Drafter):
    """DraftModel(jaxspec.load(...)): K autoregressive draft steps, sampled with the target's settings.

    Its cache holds the same tokens as the target's. Each propose first rolls it back to the
    target's length - 1 and feeds [previous token, last] (T=2): this rewrites a slot that may
    already hold the same token, and fills the slot the last accepted draft never wrote. Steps
    without drafts (adaptive K = 0) leave the cache as it is; the next propose first feeds the
    tokens they added, CATCH_UP at a time (a pass per plain step cost 3% of a target step here).
    State: DraftModelState.
    """

    METADATA = "draft.json"     # beside a saved model folder: what it was distilled for and how

    def __init__(self, model: Model, metadata: HeadMetadata | dict | None = None):
        if not isinstance(model, Model):
            raise ValueError(f"DraftModel needs a jaxspec Model, got {type(model).__name__}")
        self.model, self.metadata = model, head_metadata(metadata, (), None)
        self.graph, self.state = nnx.split(LlamaModule(model.config, model.params))

    @classmethod
    def load(cls, path: str, **kwargs) -> "DraftModel":
        """A model folder or GGUF; a folder's draft.json (written by save) becomes .metadata."""
        from ..loading import load
        meta_path = os.path.join(path, cls.METADATA)
        meta = {}
        if os.path.isfile(meta_path):
            with open(meta_path) as f:
                meta = json.load(f).get("metadata", {})
        return cls(load(path, **kwargs), meta)

    def save(self, path: str) -> None:
        """A Hugging Face model folder (bfloat16) plus draft.json with .metadata."""
        from ..loading.hf_write import save_hf_dir
        save_hf_dir(self.model, path)
        with open(os.path.join(path, self.METADATA), "w") as f:
            json.dump({"kind": "draft", "metadata": self.metadata.to_dict()}, f, indent=1)

    def __repr__(self):
        cfg = self.model.config
        return f"DraftModel({self.model.source or 'model'}, {cfg.num_layers} layers, width {cfg.hidden_size})"

    def params_for(self, model: Model) -> PyTree:
        return self.state

    def _lm(self, params) -> LlamaModule:
        return nnx.merge(self.graph, params)

    def static_key(self) -> tuple:
        return ("DraftModel", self.model.config)

    def check_target(self, model: Model) -> None:
        check_same_vocabulary(self.model, model, "draft model")

    def init(self, params: PyTree, prompts: jax.Array, lengths: jax.Array, capacity: int,
             features: jax.Array) -> PyTree:
        lm = self._lm(params)
        cache = init_cache(self.model.config, prompts.shape[0], capacity, self.model.params["embed"].dtype)
        cache = lm(prompts, cache)[2]
        return DraftModelState(rollback(cache, lengths), lengths, jnp.int32(0))

    def _feed_last(self, params, cache, ctx: Context):
        """Roll back to the target's length - 1 and run [previous token, last] -> (logits [B, 2, V], cache)."""
        start = ctx.history_len - 2                               # slot of the token before `last`
        prev = jnp.take_along_axis(ctx.history, start[:, None], axis=1)[:, 0]
        logits, _, cache = self._lm(params)(jnp.stack([prev, ctx.last], axis=1), rollback(cache, start))
        return logits, cache

    def sync(self, params: PyTree, state: PyTree, ctx: Context) -> PyTree:
        return state

    def _caught_up(self, params, state: DraftModelState, ctx: Context):
        """Take in the tokens plain steps added, then [previous token, last] -> (logits [B, 2, V], cache
        of history_len tokens)."""
        lm = self._lm(params)
        feed = lambda cache, pos: lm(jnp.take_along_axis(ctx.history, pos, axis=1), cache)[2]
        cache = catch_up(feed, state.cache, state.written, ctx.history_len - 2, ctx.history.shape[1])   # _feed_last writes on
        return self._feed_last(params, cache, ctx)

    def propose_tree(self, params: PyTree, state: DraftModelState, ctx: Context, key: jax.Array,
                     tree: Tree) -> TreeProposal:
        """An EAGLE-2 dynamic tree (tree.grow_tree): one pass of the draft model per level over the
        frontier, written after the history and seeing only its ancestors there."""
        lm, k = self._lm(params), tree.top_k
        logits, cache = self._caught_up(params, state, ctx)
        start = cache.length

        def expand(carry, tokens, parent, level):
            cache, seen = carry
            length, rope, mask = frontier_inputs(start, seen, parent, level, k, cache.capacity)
            logits, _, cache = lm(tokens, rollback(cache, length), tree=(rope, mask))
            return jax.nn.log_softmax(logits, axis=-1), (cache, mask)

        tokens, parents, valid, (cache, _) = grow_tree(jax.nn.log_softmax(logits[:, -1], axis=-1), expand,
                                                       (cache, None), tree)
        return tokens, parents, valid, None, DraftModelState(rollback(cache, start), start, jnp.int32(0))

    def propose(self, params: PyTree, state: DraftModelState, ctx: Context, key: jax.Array, num_draft: int) -> Proposal:
        lm = self._lm(params)
        logits, cache = self._caught_up(params, state, ctx)

        def step(cache, tok):
            logits, _, cache = lm(tok[:, None], cache)
            return cache, logits[:, 0]

        tokens, probs, cache = sample_chain(logits[:, -1], step, cache, key, num_draft, ctx.sampling)
        return tokens, probs, DraftModelState(cache, ctx.history_len, jnp.int32(num_draft - 1))

    def commit(self, params: PyTree, state: DraftModelState, ctx: Context, num_accepted: jax.Array) -> PyTree:
        return state._replace(written=state.written + jnp.minimum(num_accepted, state.fed), fed=jnp.int32(0))
