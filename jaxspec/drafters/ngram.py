"""Prompt-lookup drafting (Saxena 2023): match the row's last n tokens earlier in its own history
and propose what followed, trying n = max_ngram down to min_ngram. Deterministic (probs=None)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from .base import Context, Drafter


def _lookup_row(history, length, max_ngram: int, min_ngram: int, num_draft: int):
    """history int32[S], length = valid tokens -> int32[K] proposal (the last token repeated if no match)."""
    S = history.shape[0]
    starts = jnp.arange(S, dtype=jnp.int32)
    proposal = jnp.full((num_draft,), history[jnp.maximum(length - 1, 0)], jnp.int32)
    found = jnp.zeros((), bool)
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
        found |= j >= 0
    return proposal


class NGram(Drafter):
    """NGram(max_ngram=3, min_ngram=1): prompt lookup over the row's own prompt and output."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, "
                             f"max_ngram={max_ngram}")
        self.max_ngram, self.min_ngram = int(max_ngram), int(min_ngram)

    def __repr__(self):
        return f"NGram(max_ngram={self.max_ngram}, min_ngram={self.min_ngram})"

    def static_key(self):
        return ("NGram", self.max_ngram, self.min_ngram)

    def propose(self, params, state, ctx: Context, key, num_draft: int):
        lookup = lambda h, n: _lookup_row(h, n, self.max_ngram, self.min_ngram, num_draft)
        return jax.vmap(lookup)(ctx.history, ctx.history_len), None, state
