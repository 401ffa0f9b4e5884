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

from . import rowwise


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


def merge_paths(tokens: jax.Array, known: jax.Array):
    """One row's draft paths tokens int32[M, D] (known bool[M, D]: a path's first tokens up to where it
    stops) as one trie -> (tokens, parents int32[M * D], valid bool[M * D]): node j * D + d is path j's
    token d, kept when no earlier path has the same first d + 1 tokens, else its copy there is used."""
    M, D = tokens.shape
    prefix_eq = jnp.cumprod(tokens[:, None] == tokens[None], axis=2).astype(bool)   # [M, M, D]: same first d + 1
    prefix_eq &= known[None] & known[:, None]
    canon = jnp.argmax(prefix_eq, axis=1)                               # [M, D]: first path like it
    d = jnp.arange(D)
    parents = jnp.where(d[None] > 0, jnp.roll(canon, 1, axis=1) * D + d[None] - 1, -1)
    valid = known & (canon == jnp.arange(M)[:, None])
    return tokens.reshape(-1).astype(jnp.int32), parents.reshape(-1).astype(jnp.int32), valid.reshape(-1)


def ancestors(parents: jax.Array, depth: int) -> jax.Array:
    """bool[B, N + 1, N + 1]: entry [b, i, j] is True when input j (0 = last, n + 1 = node n) is input
    i or one of its ancestors. depth (static) bounds the number of parent hops."""
    B, N = parents.shape
    par = jnp.concatenate([jnp.full((B, 1), -1, parents.dtype), parents + 1], axis=1)   # inputs: last -> -1
    par = jnp.where(jnp.arange(N + 1) == 0, -1, jnp.maximum(par, 0))                # node parent -1 -> last
    node = jnp.broadcast_to(jnp.arange(N + 1), (B, N + 1))
    mask = node[:, :, None] == jnp.arange(N + 1)[None, None]                     # self
    for _ in range(depth):
        node = jnp.where(node >= 0, rowwise.gather(par, jnp.maximum(node, 0)), -1)
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
    after_parent = rowwise.gather(argmax, jnp.maximum(parents + 1, 0))          # the target's token there
    matches = valid & (tokens == after_parent)
    kept = matches
    for _ in range(depth):                                                       # a kept node's parent is kept
        parent_kept = jnp.where(parents >= 0, rowwise.gather(kept, jnp.maximum(parents, 0)), True)
        kept = matches & parent_kept
    levels = node_depths(parents, depth)[:, 1:]                                  # [B, N]
    score = jnp.where(kept, levels * (N + 1) + (N - jnp.arange(N)), 0)           # deepest, then first
    best = jnp.argmax(score, axis=1)
    n = jnp.where(jnp.any(kept, axis=1), rowwise.gather(levels, best), 0)
    on_path = rowwise.gather(ancestors(parents, depth), best + 1)[:, 1:] & (n[:, None] > 0)   # [B, N]
    order = jnp.where(on_path, levels, depth + 1)                                # path nodes sorted by level
    path = jnp.argsort(order, axis=1, stable=True)[:, :depth].astype(jnp.int32)
    path = jnp.where(jnp.arange(depth) < n[:, None], path, -1)
    bonus = rowwise.gather(argmax, jnp.where(n > 0, best + 1, 0))
    path_tokens = jnp.where(path >= 0, rowwise.gather(tokens, jnp.maximum(path, 0)), -1)
    emitted = jnp.concatenate([path_tokens, jnp.full((B, 1), -1, jnp.int32)], axis=1)
    emitted = rowwise.scatter(emitted, n, bonus)
    return n.astype(jnp.int32), path, emitted


def _sampled_row(tokens, parents, valid, p, q, key, depth: int):
    """One row of sampled_tree_accept: tokens, parents int32[N], valid bool[N], p [N + 1, V], q [N, V]."""
    N = tokens.shape[0]

    def level(_, carry):
        cur, stopped, n, path, out, key = carry
        key, k_try, k_draw = jax.random.split(key, 3)
        u = jax.random.uniform(k_try, (N,))

        def try_child(i, c):                       # child i of cur, tried in index order
            residual, taken = c                    # residual: p' unnormalised
            is_child = valid[i] & (parents[i] + 1 == cur) & (taken < 0)
            mass = jnp.sum(residual)
            keep = is_child & (u[i] * q[i, tokens[i]] * mass < residual[tokens[i]])   # u < p'(c) / q_i(c)
            rest = jnp.maximum(residual / jnp.where(mass > 0, mass, 1.0) - q[i], 0.0)  # norm(p' - q_i)+
            residual = jnp.where(is_child & ~keep, rest, residual)
            return residual, jnp.where(keep, i, taken)

        residual, taken = jax.lax.fori_loop(0, N, try_child, (p[cur], jnp.int32(-1)))
        residual = jnp.where(jnp.sum(residual) > 0, residual, p[cur])      # p' = q_i exactly: never rejected
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


def sampled_tree_accept(tokens, parents, valid, target_probs, key, depth: int, draft_probs=None):
    """Lossless acceptance on a tree: recursive rejection sampling (Jeon et al. 2024, "Recursive
    Speculative Decoding"; with one-hot drafts, SpecInfer's multi-round rejection, Miao et al. 2024).

    Walk down from `last`. At a node with target distribution p, start from p' = p and try its
    children c_1, c_2, .. in index order, child i drawn from q_i given the siblings tried before it
    (draft_probs: q_i = q with those siblings removed, renormalised, when the children are drawn
    without replacement from q; None: deterministic children, q_i one-hot on c_i). Accept c_i with
    probability min(1, p'(c_i) / q_i(c_i)); on rejection p' <- norm(max(0, p' - q_i)). When every
    child is rejected, emit a draw from p' and stop.

    Why the emitted token x is distributed as p: by the single-draft argument of Leviathan et al.
    2023 (Thm. 1), trying one draft c ~ q against p' gives P(accept c = x) = min(p'(x), q(x)) and on
    rejection leaves norm(max(0, p' - q)) as the law of what must still come out; so "accept c_1, else
    continue with the residual" emits x with probability p(x) as long as the rest of the node emits
    from the residual. c_2 is drawn from q_2 independently of the target's randomness given c_1,
    so the same argument applies to the residual, and so on down to the final draw. For one-hot
    q_i: accept c with probability p'(c), else set p'(c) = 0 and renormalise. Each emitted token is
    thus a target sample given the tokens before it, and the sequence has the target's joint law.
    The set of children may be chosen in any way that does not look at the target; with drawn
    children it must not depend on what was drawn (a fixed shape), or the q_i no longer describe them.

    tokens, parents int32[B, N]; valid bool[B, N]; target_probs [B, N + 1, V] (input 0: after last);
    draft_probs [B, N, V] or None. -> (num_accepted int32[B], path int32[B, depth], emitted
    int32[B, depth + 1]) as greedy_tree_accept. Children of one node must carry distinct tokens."""
    B, N = tokens.shape
    q = jax.nn.one_hot(tokens, target_probs.shape[-1], dtype=jnp.float32) if draft_probs is None \
        else draft_probs.astype(jnp.float32)
    keys = jax.random.split(key, B)
    return jax.vmap(lambda t, par, v, p, qq, k: _sampled_row(t, par, v, p, qq, k, depth))(
        tokens, parents, valid, target_probs.astype(jnp.float32), q, keys)


def sample_children(key, q: jax.Array, num: int):
    """Draw num distinct children from q [B, V] without replacement (Gumbel top-k: the order of the
    perturbed log-probabilities is a draw without replacement). -> (tokens int32[B, num], q_i [B, num, V]:
    the law child i was drawn from given the ones before it, as sampled_tree_accept reads it)."""
    g = jnp.log(q) - jnp.log(-jnp.log(jax.random.uniform(key, q.shape, minval=1e-20, maxval=1.0)))
    tokens = jax.lax.top_k(g, num)[1].astype(jnp.int32)                          # [B, num]
    before = jnp.cumsum(jax.nn.one_hot(tokens, q.shape[-1], dtype=q.dtype), axis=1) \
        - jax.nn.one_hot(tokens, q.shape[-1], dtype=q.dtype)                     # siblings drawn before i
    left = q[:, None] * (1.0 - before)
    return tokens, left / jnp.sum(left, axis=-1, keepdims=True)


def accept_tree(tokens, parents, valid, draft_probs, logits, sampling: dict, key, depth: int):
    """The target's logits [B, N + 1, V] over [last, nodes] -> (num_accepted, path, emitted) by greedy
    acceptance when every row is greedy, else by sampled_tree_accept under the rows' settings."""
    from .sampling import probs_from_logits

    def greedy():
        return greedy_tree_accept(tokens, parents, valid, jnp.argmax(logits, -1).astype(jnp.int32), depth)

    def sampled():
        return sampled_tree_accept(tokens, parents, valid, probs_from_logits(logits, sampling), key, depth,
                                   draft_probs)
    return jax.lax.cond(jnp.all(sampling["temperature"] == 0), greedy, sampled)


def grow_tree(first_logp: jax.Array, expand, carry, tree: Tree):
    """An EAGLE-2 dynamic tree (Li et al. 2024, "EAGLE-2", sec. 4): expand the top_k children of the
    top_k most promising nodes depth by depth, a node's value being the product of draft probabilities
    along its path, then keep the `budget` best of all nodes made (rerank). A child's value never
    exceeds its parent's and parents come first, so the kept nodes form a tree.

    first_logp [B, V]: the drafter's log-probabilities for the children of `last`. expand(carry,
    tokens int32[B, k], parent int32[B, k], level) -> (logp [B, k, V] of their children, carry): the
    drafter on the k frontier nodes of `level` (1 = children of last; parent: each one's index in the
    previous frontier, -1 at level 1). The children are deterministic (sampled_tree_accept, one-hot).
    -> (tokens int32[B, N], parents int32[B, N], valid bool[B, N], carry), nodes in level order."""
    B, k, N = first_logp.shape[0], tree.top_k, tree.budget
    score, tok = jax.lax.top_k(first_logp.astype(jnp.float32), k)                # [B, k]
    scores, toks, cands = [score], [tok], [jnp.full((B, k), -1, jnp.int32)]     # cands: parent's candidate index
    front_tok, front_score, front_idx = tok, score, jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (B, k))
    front_parent, made = jnp.full((B, k), -1, jnp.int32), k
    for level in range(1, tree.depth):
        logp, carry = expand(carry, front_tok.astype(jnp.int32), front_parent, level)
        lp, ct = jax.lax.top_k(logp.astype(jnp.float32), k)                         # [B, k, k]
        score = (front_score[:, :, None] + lp).reshape(B, k * k)
        scores.append(score), toks.append(ct.reshape(B, k * k))
        cands.append(jnp.repeat(front_idx, k, axis=1))
        front_score, pick = jax.lax.top_k(score, k)                                   # the next frontier
        front_tok, front_parent = rowwise.gather(ct.reshape(B, k * k), pick), (pick // k).astype(jnp.int32)
        front_idx, made = (made + pick).astype(jnp.int32), made + k * k
    score, tok, cand = (jnp.concatenate(x, axis=1) for x in (scores, toks, cands))   # [B, M]
    kept = min(N, made)
    sel = jnp.sort(jax.lax.top_k(score, kept)[1], axis=1)                         # ties: the earlier node
    numbers = jnp.broadcast_to(jnp.arange(kept, dtype=jnp.int32), sel.shape)
    node_of = rowwise.scatter(jnp.full((B, made), -1, jnp.int32), sel, numbers)
    parent_cand = rowwise.gather(cand, sel)
    parents = jnp.where(parent_cand >= 0, rowwise.gather(node_of, jnp.maximum(parent_cand, 0)), -1)
    valid = jnp.isfinite(rowwise.gather(score, sel)) & ((parent_cand < 0) | (parents >= 0))
    pad = lambda x, v: jnp.pad(x, ((0, 0), (0, N - kept)), constant_values=v)
    return pad(rowwise.gather(tok, sel).astype(jnp.int32), 0), pad(parents, -1), pad(valid, False), carry


def frontier_inputs(start: jax.Array, seen, parent: jax.Array, level: int, k: int, capacity: int):
    """Where and how a drafter with its own KV cache runs the k frontier nodes of `level` (grow_tree):
    written at slots start + (level - 1) k + i, RoPE position start + level - 1, each seeing the cache
    before start, its ancestors' slots and its own. seen bool[B, k, S]: the previous frontier's mask
    (None at level 1). -> (cache length to write at int32[B], RoPE positions int32[B, k], mask bool[B, k, S])."""
    B = start.shape[0]
    first = start + (level - 1) * k
    slot = jnp.arange(capacity, dtype=jnp.int32)[None, None, :]
    own = slot == (first[:, None] + jnp.arange(k, dtype=jnp.int32))[:, :, None]
    before = slot < start[:, None, None] if seen is None else rowwise.gather(seen, jnp.maximum(parent, 0))
    rope = jnp.broadcast_to((start + level - 1)[:, None], (B, k)).astype(jnp.int32)
    return first, rope, before | own
