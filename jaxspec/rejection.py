"""Speculative rejection sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023), per row, vmapped.

Draft token x_i ~ q_i is kept with probability min(1, p_i(x) / q_i(x)). At the first rejection the
replacement is drawn from norm(max(0, p_i - q_i)); when all K drafts are kept a bonus token is drawn
from p_{K+1}. The emitted tokens are then distributed exactly as the target's own samples.
With a one-hot target (temperature 0) this is exact argmax matching with the argmax as correction.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from .sampling import probs_from_logits


def _row(tokens, q, p, key):
    """tokens int32[K], q [K, V] (one-hot for deterministic drafters), p [K+1, V] -> (n, out[K+1])."""
    K = tokens.shape[0]
    key_accept, key_fix = jax.random.split(key)
    idx = jnp.arange(K)
    p_x, q_x = p[idx, tokens], q[idx, tokens]
    u = jax.random.uniform(key_accept, (K,))
    accepted = u * q_x < p_x                       # u < p/q without dividing; q_x = 0 never rejects p_x > 0
    n = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32)))  # leading run of acceptances, in [0, K]
    q_pad = jnp.concatenate([q, jnp.zeros_like(p[:1])], axis=0)   # position K: residual of p - 0 = p
    residual = jnp.maximum(p[n] - q_pad[n], 0.0)
    mass = jnp.sum(residual)
    residual = jnp.where(mass > 0, residual / jnp.where(mass > 0, mass, 1.0), p[n])  # p == q: fall back to p
    fix = jax.random.categorical(key_fix, jnp.log(residual)).astype(jnp.int32)
    slots = jnp.arange(K + 1)
    out = jnp.where(slots < n, jnp.concatenate([tokens, jnp.zeros((1,), jnp.int32)]), -1)
    return n.astype(jnp.int32), jnp.where(slots == n, fix, out)


def rejection_sample(draft_tokens: jax.Array, draft_probs: Optional[jax.Array], target_probs: jax.Array,
                     key: jax.Array):
    """draft_tokens int32[B, K]; draft_probs float[B, K, V] or None (deterministic drafter);
    target_probs float[B, K+1, V] -> (num_accepted int32[B] in [0, K], out_tokens int32[B, K+1]).

    out_tokens[b, :num_accepted[b] + 1] are the emitted tokens (accepted drafts, then the
    correction or bonus); the remaining slots are -1.
    """
    B, K = draft_tokens.shape
    V = target_probs.shape[-1]
    if target_probs.shape != (B, K + 1, V):
        raise ValueError(f"target_probs must be [B, K+1, V] = [{B}, {K + 1}, V], got {target_probs.shape}")
    draft_tokens = draft_tokens.astype(jnp.int32)
    target_probs = target_probs.astype(jnp.float32)
    if draft_probs is None:
        draft_probs = jax.nn.one_hot(draft_tokens, V, dtype=jnp.float32)
    elif draft_probs.shape != (B, K, V):
        raise ValueError(f"draft_probs must be [B, K, V] = [{B}, {K}, {V}], got {draft_probs.shape}")
    keys = jax.random.split(key, B)
    return jax.vmap(_row)(draft_tokens, draft_probs.astype(jnp.float32), target_probs, keys)


def greedy_verify(draft: jax.Array, logits: jax.Array):
    """Greedy rows: keep the drafts that equal the target's argmax, then the argmax itself. Same result
    as rejection_sample with one-hot target distributions, without building them ([B, K+1, V]).
    draft int32[B, K], logits [B, K+1, V] -> (num_accepted int32[B], out_tokens int32[B, K+1])."""
    K = draft.shape[1]
    target = jnp.argmax(logits, axis=-1).astype(jnp.int32)                   # [B, K+1]
    n = jnp.cumprod(draft == target[:, :K], axis=1).sum(1).astype(jnp.int32)
    idx = jnp.arange(K + 1)[None]
    drafts = jnp.concatenate([draft, jnp.zeros_like(draft[:, :1])], axis=1)
    return n, jnp.where(idx < n[:, None], drafts, jnp.where(idx == n[:, None], target, -1))


def verify(draft: jax.Array, draft_probs: Optional[jax.Array], logits: jax.Array, sampling: dict, key: jax.Array):
    """The target's logits [B, K+1, V] over [last, d1..dK] -> (num_accepted int32[B], out_tokens int32[B, K+1])
    by rejection sampling under the rows' sampling settings; an all-greedy batch takes greedy_verify."""
    def sampled():
        return rejection_sample(draft, draft_probs, probs_from_logits(logits, sampling), key)
    return jax.lax.cond(jnp.all(sampling["temperature"] == 0), lambda: greedy_verify(draft, logits), sampled)
