"""Token trees for speculative decoding: the static shape, the attention mask, greedy acceptance.

A tree of N draft nodes hangs below `last` (the newest emitted token, node "-1"): parents int32[B, N]
gives each node's parent (-1: a child of `last`), tokens int32[B, N] its token, valid bool[B, N]
which nodes exist (the budget N is static; unused nodes are masked). A parent always comes before
its children (parents[b, i] < i). One target pass reads N + 1 inputs, [last, node 0, .., node N-1];
input j attends to the cache and to its own ancestors only, at position length + depth.

Greedy acceptance (as SpecInfer, Miao et al. 2024, and EAGLE-2, Li et al. 2024, verify a tree at
temperature 0): a node is kept when its parent is kept (`last` is) and its token is the target's
argmax after the parent; the emitted tokens are the deepest kept node's path and then the target's
argmax after it. Along that path each token equals plain greedy decoding's, so the output does too.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Tree:
    """A tree shape: at most `budget` draft nodes N, at most `depth` D levels, `top_k` children
    expanded per node (EAGLE-2's k)."""

    budget: int = 32
    depth: int = 5
    top_k: int = 4

    def __post_init__(self):
        if not (1 <= self.depth <= self.budget and self.top_k >= 1):
            raise ValueError(f"a tree needs 1 <= depth <= budget and top_k >= 1, got {self}")


def ancestors(parents: jax.Array, depth: int) -> jax.Array:
    """bool[B, N + 1, N + 1]: entry [b, i, j] is True when input j (0 = last, n + 1 = node n) is input
    i or one of its ancestors. depth (static) bounds the number of parent hops."""
    B, N = parents.shape
    par = jnp.concatenate([jnp.full((B, 1), -1, parents.dtype), parents + 1], axis=1)   # inputs: last -> -1
    par = jnp.where(jnp.arange(N + 1) == 0, -1, jnp.maximum(par, 0))                # node parent -1 -> last
    rows = jnp.arange(B)[:, None]
    node = jnp.broadcast_to(jnp.arange(N + 1), (B, N + 1))
    mask = node[:, :, None] == jnp.arange(N + 1)[None, None]                     # self
    for _ in range(depth):
        node = jnp.where(node >= 0, par[rows, jnp.maximum(node, 0)], -1)
        mask = mask | (node[:, :, None] == jnp.arange(N + 1)[None, None])
    return mask


def node_depths(parents: jax.Array, depth: int) -> jax.Array:
    """int32[B, N + 1]: levels below `last` (0 for last itself, 1 for its children, ...)."""
    return jnp.sum(ancestors(parents, depth), axis=-1).astype(jnp.int32) - 1


def tree_inputs(length: jax.Array, parents: jax.Array, depth: int, capacity: int):
    """The target pass over [last, node 0, .., node N-1] written at slots length[b] + j: -> (RoPE positions
    int32[B, N + 1] = length + level, mask bool[B, N + 1, S]: the cache before the pass and the
    input's own ancestors), as models.forward(tree=...) takes them."""
    anc = ancestors(parents, depth)                                              # [B, N + 1, N + 1]
    B, T = anc.shape[:2]
    slot = jnp.arange(capacity, dtype=jnp.int32)[None, None, :]                  # [1, 1, S]
    rel = slot - length[:, None, None]                                           # slot's input index
    in_tree = jnp.take_along_axis(anc, jnp.clip(rel, 0, T - 1).repeat(T, axis=1), axis=2)
    mask = (rel < 0) | ((rel < T) & in_tree)
    rope = length[:, None] + node_depths(parents, depth)
    return rope.astype(jnp.int32), mask


def greedy_tree_accept(tokens: jax.Array, parents: jax.Array, valid: jax.Array, argmax: jax.Array, depth: int):
    """Greedy acceptance on a tree. argmax int32[B, N + 1]: the target's argmax after each input
    (index 0: after last). -> (num_accepted int32[B]: nodes on the kept path, path int32[B, depth]:
    the kept nodes from the top (-1 past num_accepted), emitted int32[B, depth + 1]: their tokens
    then the target's token after the deepest (-1 after it))."""
    B, N = tokens.shape
    if not 1 <= depth <= N:
        raise ValueError(f"depth must lie in [1, N = {N}], got {depth}")
    rows = jnp.arange(B)[:, None]
    after_parent = argmax[rows, jnp.maximum(parents + 1, 0)]                     # the target's token there
    matches = valid & (tokens == after_parent)
    kept = matches
    for _ in range(depth):                                                       # a kept node's parent is kept
        parent_kept = jnp.where(parents >= 0, kept[rows, jnp.maximum(parents, 0)], True)
        kept = matches & parent_kept
    levels = node_depths(parents, depth)[:, 1:]                                  # [B, N]
    score = jnp.where(kept, levels * (N + 1) + (N - jnp.arange(N)), 0)           # deepest, then first
    best = jnp.argmax(score, axis=1)
    n = jnp.where(jnp.any(kept, axis=1), levels[rows[:, 0], best], 0)
    on_path = ancestors(parents, depth)[rows[:, 0], best + 1, 1:] & (n[:, None] > 0)   # [B, N]
    order = jnp.where(on_path, levels, depth + 1)                                # path nodes sorted by level
    path = jnp.argsort(order, axis=1, stable=True)[:, :depth].astype(jnp.int32)
    path = jnp.where(jnp.arange(depth) < n[:, None], path, -1)
    bonus = argmax[rows[:, 0], jnp.where(n > 0, best + 1, 0)]
    path_tokens = jnp.where(path >= 0, tokens[rows, jnp.maximum(path, 0)], -1)
    emitted = jnp.concatenate([path_tokens, jnp.full((B, 1), -1, jnp.int32)], axis=1)
    emitted = emitted.at[jnp.arange(B), n].set(bonus)
    return n.astype(jnp.int32), path, emitted


def verify_tree_greedy(params, cfg, cache, last: jax.Array, tokens: jax.Array, parents: jax.Array,
                       valid: jax.Array, depth: int):
    """One greedy target pass over a tree below `last` int32[B] (slot cache.length): -> (num_accepted
    int32[B], emitted int32[B, depth + 1] (-1 past num_accepted + 1), the cache holding last and the
    kept path, hidden-free). The emitted tokens are plain greedy decoding's next num_accepted + 1."""
    from .cache import keep_path
    from .models import forward

    start = cache.length
    inputs = jnp.concatenate([last[:, None], tokens], axis=1)                   # [B, N + 1]
    logits, _, cache = forward(params, inputs, cache, cfg, tree=tree_inputs(start, parents, depth, cache.capacity))
    n, path, emitted = greedy_tree_accept(tokens, parents, valid, jnp.argmax(logits, -1).astype(jnp.int32), depth)
    return n, emitted, keep_path(cache, start, path)


def _sampled_row(tokens, parents, valid, p, key, depth: int):
    """One row of sampled_tree_accept: tokens, parents int32[N], valid bool[N], p [N + 1, V]."""
    N = tokens.shape[0]

    def level(_, carry):
        cur, stopped, n, path, out, key = carry
        key, k_try, k_draw = jax.random.split(key, 3)
        u = jax.random.uniform(k_try, (N,))

        def try_child(i, c):                       # child i of cur, tried in index order
            residual, taken = c
            is_child = valid[i] & (parents[i] + 1 == cur) & (taken < 0)
            keep = is_child & (u[i] * jnp.sum(residual) < residual[tokens[i]])   # u < p'(c) of the normed p'
            residual = jnp.where(is_child & ~keep, residual.at[tokens[i]].set(0.0), residual)
            return residual, jnp.where(keep, i, taken)

        residual, taken = jax.lax.fori_loop(0, N, try_child, (p[cur], jnp.int32(-1)))
        live = ~stopped
        drawn = jax.random.categorical(k_draw, jnp.log(residual)).astype(jnp.int32)
        token = jnp.where(taken >= 0, tokens[jnp.maximum(taken, 0)], drawn)
        out = jnp.where(live, out.at[n].set(token), out)
        path = jnp.where(live & (taken >= 0), path.at[n].set(taken), path)
        n_next = jnp.where(live & (taken >= 0), n + 1, n)
        return (jnp.where(live & (taken >= 0), taken + 1, cur), stopped | (taken < 0), n_next, path, out, key)

    init = (jnp.int32(0), jnp.bool_(False), jnp.int32(0), jnp.full((depth,), -1, jnp.int32),
            jnp.full((depth + 1,), -1, jnp.int32), key)
    _, _, n, path, out, _ = jax.lax.fori_loop(0, depth + 1, level, init)
    return n, path, out


def sampled_tree_accept(tokens, parents, valid, target_probs, key, depth: int):
    """Lossless acceptance on a tree of deterministic children (the top-k children of EAGLE-2 style
    drafting; SpecInfer, Miao et al. 2024, multi-round rejection with one-hot drafts). Walk down from
    `last`: at a node with target distribution p, start from p' = p and try its children c in index
    order; accept c with probability p'(c) (normalised), else set p'(c) = 0 and renormalise; when no
    child is accepted, emit a draw from p' and stop. The token emitted at a node is distributed as p:
    P(first child) = p(c1); after rejecting c1, p' is p conditioned on not c1, so P(c2) = (1 - p(c1))
    p(c2) / (1 - p(c1)) = p(c2), and so on; the final draw gives every other token p(x). Each emitted
    token is thus a sample of the target given the tokens before it: the sequence has the target's law.
    tokens, parents int32[B, N]; valid bool[B, N]; target_probs [B, N + 1, V] (input 0: after last).
    -> (num_accepted int32[B], path int32[B, depth], emitted int32[B, depth + 1]) as greedy_tree_accept.
    Children of one node must carry distinct tokens."""
    keys = jax.random.split(key, tokens.shape[0])
    return jax.vmap(lambda t, par, v, p, k: _sampled_row(t, par, v, p, k, depth))(
        tokens, parents, valid, target_probs, keys)
