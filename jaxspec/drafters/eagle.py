"""EAGLE drafter: an EAGLE-3-style head (heads/eagle.py) reading the target's own features.

The head's cache holds one entry per target position t: the pair (feature_t, token_{t+1}).
After a verify pass with n accepted drafts, the n+1 new pairs are known (features of the
pass, emitted tokens); propose writes them, takes the head's output at the last one as the first
draft, then drafts on from its own outputs. Rollback of the head's cache is a length change.

In steps without drafts (adaptive K = 0) sync only stores the pass's features; the next propose
writes the pairs it skipped in chunks of CATCH_UP positions. Running the head on every plain
step instead cost about 4-5% of a target step on this project's CPU.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from .. import rowwise
from ..cache import init_cache, rollback
from ..heads.eagle import EagleConfig, EagleHead
from ..heads.io import load_head, save_head
from ..model import Model
from ..tree import Tree, frontier_inputs, grow_tree
from .base import (Context, HeadDrafter, Proposal, PyTree, TreeProposal, catch_up, check_head_target,
                   sample_chain)

KIND = "eagle"


class EagleState(NamedTuple):
    """The EAGLE drafter's state between steps."""

    cache: object           # the head's KVCache: one entry per target position (feature_t, token_{t+1})
    n_prev: jax.Array       # int32[B]: drafts the last verify pass accepted
    written: jax.Array      # int32[B]: pairs in the head cache that are final
    stored: jax.Array       # [N, B, S, E]: target features of positions plain steps passed (sync)


class Eagle(HeadDrafter):
    """Eagle(EagleHead) or Eagle(head arrays, cfg), with optional metadata, or Eagle.load(path); serves
    the target it was trained on (base.HeadDrafter)."""

    head_class = EagleHead
    @staticmethod
    def layers_read(cfg: EagleConfig) -> tuple:
        return tuple(cfg.feature_layers)

    @property
    def head_params(self) -> dict:
        """{name: array} of the head (heads/eagle.py)."""
        return self.head().arrays()

    @classmethod
    def load(cls, path: str) -> "Eagle":
        config, params, meta = load_head(path, KIND)
        config["feature_layers"] = tuple(config["feature_layers"])
        return cls(params, EagleConfig(**config), meta)

    def save(self, path: str) -> None:
        save_head(path, KIND, self.cfg.__dict__, self.head_params, self.metadata.to_dict())

    def __repr__(self):
        tied = ", the target's output rows" if self.cfg.tied_head else ""
        return f"Eagle(layers {self.cfg.feature_layers}, draft vocab {self.cfg.draft_vocab_size}{tied})"

    def static_key(self) -> tuple:
        return (KIND, self.cfg)

    def check_target(self, model: Model) -> None:
        check_head_target("EAGLE", self.cfg.target_vocab_size, self.cfg.hidden_size, self.metadata, model)

    def params_for(self, model: Model) -> PyTree:
        rows = self.head().output_rows(model.params)                           # [E, Vd]
        return {"head": self.state, "embed": model.params["embed"], "rows": rows}

    def init(self, params: PyTree, prompts: jax.Array, lengths: jax.Array, capacity: int,
             features: jax.Array) -> PyTree:
        """Write the prompt's pairs (feature_t, prompt_{t+1}) for t < length - 1.
        -> EagleState."""
        B = prompts.shape[0]
        head = self.head(params)
        cache = init_cache(self.cfg.cache_config(), B, capacity, head.fc.dtype)
        nxt = jnp.concatenate([prompts[:, 1:], jnp.zeros((B, 1), prompts.dtype)], axis=1)
        _, _, cache = head.step(params["embed"], head.fuse(features), nxt, cache, params["rows"])
        stored = jnp.zeros(features.shape[:2] + (capacity,) + features.shape[3:], features.dtype)
        return EagleState(rollback(cache, lengths - 1), jnp.zeros((B,), jnp.int32), lengths - 1, stored)

    def _catch_up(self, params, state: EagleState, ctx: Context):
        """The head cache with the pairs of positions [written, the last pass's first) from the stored features."""
        stored, head = state.stored, self.head(params)

        def feed(cache, pos):                                          # pos [B, C]
            tokens = rowwise.gather(ctx.history, pos + 1)
            return head.step(params["embed"], head.fuse(rowwise.gather(stored, pos, axis=1)), tokens, cache,
                             params["rows"])[2]

        return catch_up(feed, state.cache, state.written, ctx.feature_positions(state.n_prev)[:, 0],
                        stored.shape[2])

    def _write_pairs(self, params, state: EagleState, ctx: Context):
        """Write the n_prev + 1 pairs the last verify pass left (padded to P, the rest masked)
        -> (head outputs h, draft logits [B, P, ...] at those pairs, cache rolled back to the target's)."""
        cache, target_len = state.cache, ctx.history_len - 1
        first_pos = ctx.feature_positions(state.n_prev)[:, 0]   # the first pair the last pass revealed
        P = ctx.features.shape[2]
        tok_idx = jnp.minimum(first_pos[:, None] + 1 + jnp.arange(P), ctx.history.shape[1] - 1)
        tokens = rowwise.gather(ctx.history, tok_idx)
        head = self.head(params)
        h, logits, cache = head.step(params["embed"], head.fuse(ctx.features), tokens, rollback(cache, first_pos),
                                     params["rows"])
        return h, logits, rollback(cache, target_len)

    def sync(self, params: PyTree, state: EagleState, ctx: Context) -> PyTree:
        """Store the last pass's features at their positions (no head pass; see _catch_up)."""
        pos = ctx.feature_positions(state.n_prev)                                                  # [B, P]
        stored = rowwise.scatter(state.stored, pos, ctx.features, axis=1)
        return state._replace(stored=stored)

    def propose(self, params: PyTree, state: EagleState, ctx: Context, key: jax.Array, num_draft: int) -> Proposal:
        head, embed = self.head(params), params["embed"]
        state = state._replace(cache=self._catch_up(params, state, ctx))
        n_prev, K = state.n_prev, num_draft
        h, logits, cache = self._write_pairs(params, state, ctx)

        def step(carry, tok):
            cache, h = carry
            h, logits, cache = head.step(embed, h, tok[:, None], cache, params["rows"])
            return (cache, h), head.target_logits(logits[:, 0])

        tokens, probs, (cache, _) = sample_chain(head.target_logits(rowwise.gather(logits, n_prev)), step,
                                                 (cache, rowwise.gather(h, n_prev)[:, None]), key, K, ctx.sampling)
        return tokens, probs, state._replace(cache=cache, written=ctx.history_len - 1)

    def propose_tree(self, params: PyTree, state: EagleState, ctx: Context, key: jax.Array, tree: Tree) -> TreeProposal:
        """An EAGLE-2 dynamic tree (tree.grow_tree): the head runs once per level over the frontier,
        each node's pair (its parent's head output, its token) written after the target's length and
        seeing only its ancestors there."""
        head, embed, k = self.head(params), params["embed"], tree.top_k
        state = state._replace(cache=self._catch_up(params, state, ctx))
        h, logits, cache = self._write_pairs(params, state, ctx)
        start, h_root = cache.length, rowwise.gather(h, state.n_prev)            # h_root [B, E]
        logp = lambda draft_logits: jax.nn.log_softmax(head.target_logits(draft_logits), axis=-1)

        def expand(carry, tokens, parent, level):
            cache, seen, h_front = carry
            h_in = jnp.broadcast_to(h_root[:, None], (*tokens.shape, h_root.shape[-1])) if level == 1 \
                else rowwise.gather(h_front, parent)                                # [B, k, E]
            length, rope, mask = frontier_inputs(start, seen, parent, level, k, cache.capacity)
            h_out, logits, cache = head.step(embed, h_in, tokens, rollback(cache, length), params["rows"],
                                             tree=(rope, mask))
            return logp(logits), (cache, mask, h_out)

        tokens, parents, valid, (cache, _, _) = grow_tree(logp(rowwise.gather(logits, state.n_prev)), expand,
                                                          (cache, None, None), tree)
        return tokens, parents, valid, None, state._replace(cache=rollback(cache, start),
                                                            written=ctx.history_len - 1)

    def commit(self, params: PyTree, state: EagleState, ctx: Context, num_accepted: jax.Array) -> PyTree:
        return state._replace(n_prev=num_accepted)
