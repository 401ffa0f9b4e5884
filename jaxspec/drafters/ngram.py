"""Prompt-lookup drafting (Saxena 2023): match the row's last n tokens earlier in its own history
and propose what followed, trying n = max_ngram down to min_ngram. Deterministic (probs=None)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..tree import Tree, merge_paths
from .base import Context, Drafter, Proposal, PyTree, TreeProposal

PRIOR_BY_MATCH = (0.4, 0.6, 0.8)          # assumed acceptance after a match of 1, 2, >= 3 tokens


def _lookup_row(history, length, max_ngram: int, min_ngram: int, num_draft: int):
    """history int32[S], length = valid tokens -> (int32[K] proposal (the last token repeated if no
    match), int32 length of the matched n-gram (0: none))."""
    S = history.shape[0]
    starts = jnp.arange(S, dtype=jnp.int32)
    proposal = jnp.full((num_draft,), history[jnp.maximum(length - 1, 0)], jnp.int32)
    found = jnp.zeros((), bool)
    matched = jnp.zeros((), jnp.int32)
    for n in range(max_ngram, min_ngram - 1, -1):      # longest n-gram first
        pattern = jax.lax.dynamic_slice(history, (jnp.maximum(length - n, 0),), (n,))
        match = starts + n < length                     # a continuation token must exist
        for i in range(n):
            match &= history[jnp.minimum(starts + i, S - 1)] == pattern[i]
        match &= length >= n + 1
        j = jnp.max(jnp.where(match, starts, -1))       # the most recent occurrence
        follow = jnp.clip(j + n + jnp.arange(num_draft), 0, S - 1)
        cont = jnp.where(j + n + jnp.arange(num_draft) < length, history[follow], proposal[0])
        use = (j >= 0) & ~found
        proposal = jnp.where(use, cont, proposal)
        matched = jnp.where(use, n, matched)
        found |= j >= 0
    return proposal, matched


def _tree_row(history, length, max_ngram: int, min_ngram: int, num_paths: int, depth: int):
    """One row of NGram.propose_tree: the continuations after the num_paths best earlier matches of
    the row's last tokens (longest match first, then most recent), merged into a trie (merge_paths)."""
    S = history.shape[0]
    c = jnp.arange(S, dtype=jnp.int32)                             # a continuation's first slot
    same = [history[jnp.clip(c - 1 - j, 0, S - 1)] == history[jnp.maximum(length - 1 - j, 0)]
            for j in range(max_ngram)]
    matched = jnp.sum(jnp.cumprod(jnp.stack(same), axis=0), axis=0)     # suffix tokens matched before c
    matched = jnp.minimum(matched, c)                                   # not past the history's start
    score = jnp.where((matched >= min_ngram) & (c < length), matched * S + c, -1)
    best, starts = jax.lax.top_k(score, num_paths)                      # [M]
    slot = starts[:, None] + jnp.arange(depth)                          # [M, D]
    known = (best[:, None] >= 0) & (slot < length)
    return merge_paths(history[jnp.minimum(slot, S - 1)], known)


class NGram(Drafter):
    """NGram(max_ngram=3, min_ngram=1): prompt lookup over the row's own prompt and output."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, "
                             f"max_ngram={max_ngram}")
        self.max_ngram, self.min_ngram = int(max_ngram), int(min_ngram)

    def __repr__(self):
        return f"NGram(max_ngram={self.max_ngram}, min_ngram={self.min_ngram})"

    def static_key(self) -> tuple:
        return ("NGram", self.max_ngram, self.min_ngram)

    @property
    def prior_acceptance(self) -> tuple:
        """Per context (matched n-gram length 0..max_ngram). Longer matches are kept more often;
        without a match the proposal is a guess. Measured on SmolLM2's self-distilled training
        answers (per-token acceptance, K = 3): no match 0.003, n = 1: 0.40, 2: 0.61, 3: 0.80."""
        return (0.0,) + tuple(PRIOR_BY_MATCH[min(n, len(PRIOR_BY_MATCH)) - 1] for n in range(1, self.max_ngram + 1))

    def _lookup(self, ctx: Context, num_draft: int):
        lookup = lambda h, n: _lookup_row(h, n, self.max_ngram, self.min_ngram, num_draft)
        return jax.vmap(lookup)(ctx.history, ctx.history_len)

    def context(self, params: PyTree, state: PyTree, ctx: Context) -> jax.Array:
        return self._lookup(ctx, 1)[1]

    def propose(self, params: PyTree, state: PyTree, ctx: Context, key: jax.Array, num_draft: int) -> Proposal:
        return self._lookup(ctx, num_draft)[0], None, state

    def propose_tree(self, params: PyTree, state: PyTree, ctx: Context, key: jax.Array, tree: Tree) -> TreeProposal:
        """budget // depth continuations from different earlier matches, merged into one tree (the
        rest of the budget unused; top_k is not read)."""
        M, D = tree.budget // tree.depth, tree.depth
        tokens, parents, valid = jax.vmap(lambda h, n: _tree_row(h, n, self.max_ngram, self.min_ngram, M, D))(
            ctx.history, ctx.history_len)
        pad = lambda x, v: jnp.pad(x, ((0, 0), (0, tree.budget - M * D)), constant_values=v)
        return pad(tokens, 0), pad(parents, -1), pad(valid, False), None, state
