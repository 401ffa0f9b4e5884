"""MTP drafter: DeepSeek-V3-style multi-token-prediction modules (heads/mtp.py) on the target's last
hidden state.

With history length n (the newest token at position n - 1, not yet in the target's cache), module j
at position n - 2 reads h^{j-1}_{n-2} and token_{n-2+j} and drafts token_{n-1+j}: module 1 the
token after `last`, module j the j-th draft. For K > D the last module runs on along the positions,
its own output standing in for h^{D-1}. Each propose recomputes every module over the window of the
last W = max(K + min(K, D), D) positions (inputs there may have been drafts that the target has
since replaced); positions before `written` are final in the modules' KV caches, and those between
it and the window (left by plain steps, whose sync only stores h^0, or by a jump longer than the
window) are first taken in CATCH_UP at a time. h^0 of past positions is kept in a static buffer
[B, S, E]. Rollback is a length change, as for the target.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from .. import rowwise
from ..cache import init_cache, rollback
from ..heads.eagle import to_target_logits
from ..heads.io import load_head, save_head
from ..heads.mtp import MTPConfig, MTPHead, mtp_logits, mtp_module, mtp_window
from ..model import Model
from ..models import lm_head_rows
from ..tree import Tree, grow_tree
from .base import (Context, HeadDrafter, Proposal, PyTree, TreeProposal, catch_up, check_head_target,
                   draw_token)

KIND = "mtp"


class MTPState(NamedTuple):
    """The MTP drafter's state between steps."""

    cache: object           # the modules' KVCache (one layer per module)
    h0: jax.Array           # [B, S, E]: the target's last hidden state of past positions
    n_prev: jax.Array       # int32[B]: drafts the last step accepted
    written: jax.Array      # int32[B]: positions below are final in every module
    drafted: jax.Array      # int32[]: K of a propose not yet committed, else 0


class MTP(HeadDrafter):
    """MTP(MTPHead) or MTP(stacked head arrays, cfg), with optional metadata, or MTP.load(path); serves
    the target it was trained on (base.HeadDrafter)."""

    head_class = MTPHead
    @staticmethod
    def layers_read(cfg: MTPConfig) -> tuple:
        return (cfg.target_layers,)

    @property
    def head_params(self) -> dict:
        """The head's arrays stacked over modules (heads/mtp.py)."""
        return self.head().stacked()

    @classmethod
    def load(cls, path: str) -> "MTP":
        config, flat, meta = load_head(path, KIND)
        params = {k: v for k, v in flat.items() if not k.startswith("block.")}
        params["block"] = {k[len("block."):]: v for k, v in flat.items() if k.startswith("block.")}
        return cls(params, MTPConfig(**config), meta)

    def save(self, path: str) -> None:
        flat = {k: v for k, v in self.head_params.items() if k != "block"}
        flat.update({f"block.{k}": v for k, v in self.head_params["block"].items()})
        save_head(path, KIND, self.cfg.__dict__, flat, self.metadata.to_dict())

    def __repr__(self):
        return f"MTP({self.cfg.num_modules} modules, draft vocab {self.cfg.draft_vocab_size})"

    def static_key(self) -> tuple:
        return (KIND, self.cfg)

    def check_target(self, model: Model) -> None:
        check_head_target("MTP", self.cfg.target_vocab_size, self.cfg.hidden_size, self.metadata, model)
        if model.config.num_layers != self.cfg.target_layers:
            raise ValueError(f"MTP head reads layer {self.cfg.target_layers}; the target has "
                             f"{model.config.num_layers} layers")

    def params_for(self, model: Model) -> PyTree:
        rows = lm_head_rows(model.params, self.head().d2t[...])
        return {"head": self.state, "embed": model.params["embed"], "norm": model.params["norm"], "rows": rows}

    def _head(self, params) -> dict:
        """The head's arrays, its modules kept apart (MTPHead.arrays)."""
        return self.head(params).arrays()

    def _logits(self, params, h):
        return to_target_logits(self._head(params), mtp_logits(params["norm"], params["rows"], h,
                                                            self.cfg.rms_norm_eps), self.cfg.target_vocab_size)

    def init(self, params: PyTree, prompts: jax.Array, lengths: jax.Array, capacity: int,
             features: jax.Array) -> PyTree:
        """Keep the prompt's h^0 and run every module over the prompt -> MTPState."""
        B, T = prompts.shape
        cfg = self.cfg
        h0 = features[0]                                                      # [B, T, E]
        buf = jnp.zeros((B, capacity, cfg.hidden_size), h0.dtype).at[:, :T].set(h0)
        cache = init_cache(cfg.cache_config(), B, capacity, h0.dtype)
        nxt = jnp.concatenate([prompts[:, 1:], jnp.zeros((B, cfg.num_modules), prompts.dtype)], axis=1)
        _, cache = mtp_window(self._head(params), params["embed"], h0, nxt, cache, cfg, jnp.zeros((B,), jnp.int32))
        zeros = jnp.zeros((B,), jnp.int32)       # position p is final once token p + D is known
        return MTPState(rollback(cache, lengths - 1), buf, zeros, jnp.maximum(lengths - cfg.num_modules, 0),
                        jnp.int32(0))

    def _store(self, state: MTPState, ctx: Context):
        """The h^0 buffer with the last pass's h^0 at positions n - 2 - n_prev .. (those up to n - 2 are final)."""
        return rowwise.scatter(state.h0, ctx.feature_positions(state.n_prev), ctx.features[0])

    def _catch_up(self, params, cache, buf, written, end, ctx: Context):
        """Every module over positions [written, end) (all inputs final there), CATCH_UP at a time."""
        D = self.cfg.num_modules

        def feed(cache, pos):                                                 # pos [B, C] from cache.length
            nxt = pos[:, :1] + 1 + jnp.arange(pos.shape[1] + D - 1)           # token_{p+1}, D - 1 further
            nxt = rowwise.gather(ctx.history, nxt)                             # clamped to the last slot
            return mtp_window(self._head(params), params["embed"], rowwise.gather(buf, pos), nxt, cache, self.cfg,
                              cache.length)[1]

        return catch_up(feed, cache, written, end, buf.shape[1])

    def sync(self, params: PyTree, state: MTPState, ctx: Context) -> PyTree:
        """Store the last pass's h^0; the modules take it in at the next propose (_catch_up)."""
        return state._replace(h0=self._store(state, ctx))

    def propose(self, params: PyTree, state: MTPState, ctx: Context, key: jax.Array, num_draft: int) -> Proposal:
        return self._draft(params, state, ctx, key, num_draft, lambda logits, k: draw_token(logits, k, ctx.sampling))

    def propose_tree(self, params: PyTree, state: MTPState, ctx: Context, key: jax.Array, tree: Tree) -> TreeProposal:
        """A static tree (Medusa, Cai et al. 2024, over MTP modules): the modules draft the top-1 chain of
        tree.depth tokens, and each level's distribution along it gives the children of every node at
        that level; tree.grow_tree keeps the budget best. After it only the positions the chain's
        known tokens fix are final (commit counts none of its drafts)."""
        greedy = lambda logits, _: (jnp.argmax(logits, -1).astype(jnp.int32), jax.nn.log_softmax(logits, -1))
        _, logp, state = self._draft(params, state, ctx, key, tree.depth, greedy)     # logp [B, D, V]
        expand = lambda carry, tokens, parent, level: (jnp.broadcast_to(logp[:, level][:, None],
                                                                        (*tokens.shape, logp.shape[-1])), carry)
        tokens, parents, valid, _ = grow_tree(logp[:, 0], expand, (), tree)
        return tokens, parents, valid, None, state._replace(drafted=jnp.int32(0))

    def _draft(self, params, state: MTPState, ctx: Context, key, num_draft: int, draw):
        """K drafts, each from draw(target logits [B, V], key) -> (token int32[B], q [B, V])."""
        head, embed, cfg = self._head(params), params["embed"], self.cfg
        K, D = num_draft, min(num_draft, cfg.num_modules)
        W = max(K + D, cfg.num_modules)
        buf, n = self._store(state, ctx), ctx.history_len
        start = jnp.maximum(n - 1 - W, 0)                                     # the window: start .. n - 2
        cache = self._catch_up(params, state.cache, buf, state.written, start, ctx)
        window = start[:, None] + jnp.arange(W)                               # [B, W] positions
        h = rowwise.gather(buf, window)                                       # clamped like the slots
        at = n - 2 - start                                                    # window index of n - 2
        seq = ctx.history                                                     # drafts go in at n, n + 1, ...
        keys = jax.random.split(key, K)
        tokens, probs = [], []
        for j in range(D):                                                    # draft j + 1 from module j + 1
            h, cache = mtp_module(head, j, embed, h, rowwise.gather(seq, window + j + 1), rollback(cache, start), cfg)
            tok, q = draw(self._logits(params, rowwise.gather(h, at)), keys[j])
            seq = rowwise.scatter(seq, n + j, tok)
            tokens.append(tok), probs.append(q)
        h_rest = h
        for j in range(D, cfg.num_modules):       # K < D: keep the caches of the modules not drafting current
            h_rest, cache = mtp_module(head, j, embed, h_rest, rowwise.gather(seq, window + j + 1),
                                       rollback(cache, start), cfg)
        h = rowwise.gather(h, at)[:, None]
        for j in range(D, K):                                                 # the last module runs on
            q_pos = n - 2 + (j - D + 1)
            h, cache = mtp_module(head, D - 1, embed, h, rowwise.gather(seq, (n - 1 + j)[:, None]),
                                  rollback(cache, q_pos), cfg)
            tok, q = draw(self._logits(params, h[:, 0]), keys[j])
            seq = rowwise.scatter(seq, n + j, tok)
            tokens.append(tok), probs.append(q)
        state = state._replace(cache=rollback(cache, n - 1), h0=buf, written=jnp.maximum(state.written, start),
                               drafted=jnp.int32(K))
        return jnp.stack(tokens, 1), jnp.stack(probs, 1), state

    def commit(self, params: PyTree, state: MTPState, ctx: Context, num_accepted: jax.Array) -> PyTree:
        """After a propose, window positions p < n + num_accepted - D read only kept tokens: final."""
        n = ctx.history_len
        final = jnp.minimum(n - 1, n + num_accepted - self.cfg.num_modules)
        written = jnp.where(state.drafted > 0, jnp.maximum(state.written, final), state.written)
        return state._replace(n_prev=num_accepted, written=written, drafted=jnp.int32(0))
