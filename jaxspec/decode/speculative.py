"""The speculative loop: each step the drafter proposes K tokens, one target pass verifies the K+1
inputs [last, d1..dK], rejection sampling keeps a prefix and adds one token, and the caches roll back
by length alone (no erase). A tree step (jaxspec/tree.py) verifies a token tree instead and moves the
kept path's cache entries behind `last`."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from .. import policy, rowwise, streaming
from ..cache import KVCache, rollback
from ..config import ModelConfig
from ..drafters.base import Context, Drafter
from ..cache import keep_path
from ..models import forward
from ..rejection import verify
from ..sampling import sample_tokens
from ..tree import Tree, accept_tree, tree_inputs
from .batch import live_slots
from .programs import TRACES


class AcceptCounts(NamedTuple):
    """Acceptance statistics summed over the loop (rows that are done count no more)."""

    steps: jax.Array                  # int32: row-steps of active rows
    accepted: jax.Array               # int32: drafts kept
    drafted: jax.Array                # int32: drafts made
    per_position: jax.Array           # int32[K]: drafts kept at each position
    drafted_per_position: jax.Array   # int32[K]: drafts made at each position (trees: steps with that level)
    k_steps: jax.Array                # int32[len(ks)]: loop steps run with each arm (K or tree)


class SpecState(NamedTuple):
    """The loop's carry."""

    cache: KVCache          # target KV cache; length = tokens in it per row
    dstate: Any             # the drafter's state (its own NamedTuple)
    last: jax.Array         # int32[B]: newest token, emitted but not yet in the target cache
    history: jax.Array      # int32[B, S + P]: prompt + output per row
    count: jax.Array        # int32[B]: new tokens so far
    done: jax.Array         # bool[B]
    key: jax.Array          # PRNG key
    steps: jax.Array        # int32: loop steps (target passes)
    acc: AcceptCounts
    features: jax.Array     # [N, B, P, E]: hidden states of the last target pass (padding past its tokens)
    est: policy.Estimate    # adaptive: acceptance estimates per drafter context
    context: jax.Array      # int32[B]: each row's drafter context for the next step
    choice: jax.Array       # int32: index into ks of the next step's arm


class Fixed(NamedTuple):
    """What every step reads and none changes."""

    params: dict            # the target's parameters
    dparams: Any            # drafter.params_for(target)
    limits: jax.Array       # int32[B]: max new tokens per row
    eos_ids: jax.Array      # int32[*]
    sampling: dict          # per-row sampling arrays [B]
    costs: jax.Array        # float32[len(ks)]: step cost of each arm in plain steps
    force: jax.Array        # int32: -1, or the index into ks of the arm every step takes (cost timing)
    sync: jax.Array         # bool: False skips the drafter's sync in K = 0 steps (the timing's plain steps)
    max_steps: jax.Array    # int32: the loop stops after this many steps (cost timing) or when every row is done
    stream_id: jax.Array    # int32: where a streaming loop sends each step's tokens (jaxspec/streaming.py)


@dataclasses.dataclass(frozen=True)
class Static:
    """Everything that shapes the compiled loop."""

    cfg: ModelConfig
    drafter: Drafter
    ks: tuple               # the arms one loop switches between: chain K (int) or Tree (one: fixed)
    width: int              # P = the most drafts a step keeps + 1: a step's emitted tokens and features
    live_attention: bool
    stream: bool = False    # send each step's tokens to the host (streaming.send)

    @property
    def adaptive(self) -> bool:
        return len(self.ks) > 1


def spec_step(params, dparams, cache, dstate, ctx: Context, key, live=None, sync=None, *, cfg, drafter, num_draft,
              width):
    """One step with K = num_draft drafts, or K = 0: a plain target step while the drafter syncs.
    live: the cache slots the target pass reads (None: all; see batch.live_slots). sync (traced bool,
    optional): False skips the drafter's sync at K = 0, a plain step for the cost timing's reference.

    -> (num_accepted int32[B], emitted int32[B, width] (-1 past the step's K+1), target cache with
    length += K+1, drafter state, hidden [N, B, width, E] of the pass, zero-padded)."""
    K = num_draft
    k_draft, k_accept = jax.random.split(key)
    before = dstate
    if K == 0:
        dstate = drafter.sync(dparams, dstate, ctx) if sync is None else \
            jax.lax.cond(sync, lambda d: drafter.sync(dparams, d, ctx), lambda d: d, dstate)
        logits, hidden, cache = forward(params, ctx.last[:, None], cache, cfg, drafter.hidden_layers, live)
        n, emitted = jnp.zeros_like(ctx.last), sample_tokens(k_accept, logits, ctx.sampling)
    else:
        draft, draft_probs, dstate = drafter.propose(dparams, dstate, ctx, k_draft, K)
        check_proposal(drafter, draft, draft_probs, ctx.last.shape[0], K, cfg.vocab_size)
        inputs = jnp.concatenate([ctx.last[:, None], draft], axis=1)              # [B, K+1]
        logits, hidden, cache = forward(params, inputs, cache, cfg, drafter.hidden_layers, live)
        n, emitted = verify(draft, draft_probs, logits, ctx.sampling, k_accept)
    check_state(drafter, before, dstate, "sync" if K == 0 else "propose")
    pad = width - (K + 1)
    emitted = jnp.pad(emitted, ((0, 0), (0, pad)), constant_values=-1)
    hidden = jnp.pad(hidden, ((0, 0), (0, 0), (0, pad), (0, 0)))
    return n, emitted, cache, dstate, hidden


def tree_step(params, dparams, cache, dstate, ctx: Context, key, *, cfg, drafter, tree: Tree, width):
    """One step over a token tree: drafter.propose_tree, one target pass over [last, N nodes] with
    the ancestor mask (tree.tree_inputs), lossless acceptance (tree.accept_tree), the kept path's
    cache entries moved behind last (cache.keep_path). -> as spec_step; hidden holds the features of
    [last, the kept path], so the drafter sees what a chain step with those drafts would show it."""
    k_draft, k_accept = jax.random.split(key)
    before = dstate
    tokens, parents, valid, probs, dstate = drafter.propose_tree(dparams, dstate, ctx, k_draft, tree)
    check_tree(drafter, tokens, parents, valid, probs, ctx.last.shape[0], tree.budget, cfg.vocab_size)
    check_state(drafter, before, dstate, "propose_tree")
    n, emitted, path, hidden, cache = verify_tree(params, cache, ctx.last, tokens, parents, valid, probs,
                                                  ctx.sampling, k_accept, cfg=cfg, depth=tree.depth,
                                                  hidden_layers=drafter.hidden_layers)
    on_path = jnp.concatenate([jnp.zeros_like(path[:, :1]), jnp.maximum(path + 1, 0)], axis=1)   # [B, D + 1]
    pad = width - (tree.depth + 1)
    hidden = jnp.pad(rowwise.gather(hidden, on_path, axis=1), ((0, 0), (0, 0), (0, pad), (0, 0)))
    return n, jnp.pad(emitted, ((0, 0), (0, pad)), constant_values=-1), cache, dstate, hidden


def verify_tree(params, cache, last, tokens, parents, valid, probs, sampling: dict, key, *, cfg, depth: int,
                hidden_layers: tuple = ()):
    """One target pass over [last int32[B], N nodes] (slot cache.length on) with the ancestor mask, then
    lossless acceptance: -> (num_accepted int32[B], emitted int32[B, D + 1] (-1 past num_accepted + 1),
    path int32[B, D] (node indices, -1 past num_accepted), hidden [L, B, N + 1, E], the cache holding last
    and the kept path behind the old length)."""
    start = cache.length
    inputs = jnp.concatenate([last[:, None], tokens], axis=1)                       # [B, N + 1]
    logits, hidden, cache = forward(params, inputs, cache, cfg, hidden_layers,
                                    tree=tree_inputs(start, parents, depth, cache.capacity))
    n, path, emitted = accept_tree(tokens, parents, valid, probs, logits, sampling, key, depth)
    return n, emitted, path, hidden, keep_path(cache, start, path)


def check_tree(drafter: Drafter, tokens, parents, valid, probs, B: int, N: int, V: int) -> None:
    """Trace-time checks of a drafted tree: tokens, parents int32[B, N], valid bool[B, N], probs [B, N, V] or None."""
    try:
        chex.assert_shape([tokens, parents, valid], (B, N))
        chex.assert_type([tokens, parents, valid], [jnp.int32, jnp.int32, bool])
        if probs is not None:
            chex.assert_shape(probs, (B, N, V))
    except AssertionError as e:
        raise ValueError(f"{type(drafter).__name__}.propose_tree must return tokens and parents int32[{B}, {N}], "
                         f"valid bool[{B}, {N}] and probs [{B}, {N}, {V}] or None: {e}") from None


def check_proposal(drafter: Drafter, draft, draft_probs, B: int, K: int, V: int) -> None:
    """Trace-time checks of what a drafter proposes: tokens int32[B, K], probs [B, K, V] or None."""
    who = type(drafter).__name__
    try:
        chex.assert_shape(draft, (B, K))
        chex.assert_type(draft, jnp.int32)
        if draft_probs is not None:
            chex.assert_shape(draft_probs, (B, K, V))
    except AssertionError as e:
        raise ValueError(f"{who}.propose must return tokens int32[{B}, {K}] and probs [{B}, {K}, {V}] "
                         f"or None: {e}") from None


def check_state(drafter: Drafter, before, after, method: str) -> None:
    """Trace-time check that a drafter's method keeps its state's structure, shapes and dtypes (the
    compiled loop carries it from step to step)."""
    try:
        chex.assert_trees_all_equal_shapes_and_dtypes(before, after)
    except (AssertionError, ValueError) as e:
        raise ValueError(f"{type(drafter).__name__}.{method} changed its state's structure, shapes or "
                         f"dtypes: {e}") from None


def emit(buf, start, tokens, count):
    """Write tokens[B, W] at buf[b, start[b] + i] for i < count[b] (other slots dropped)."""
    idx = jnp.arange(tokens.shape[1], dtype=jnp.int32)
    slots = jnp.where(idx[None] < count[:, None], start[:, None] + idx[None], buf.shape[1])
    return rowwise.scatter(buf, slots, tokens)


def _context_of(s: SpecState, fixed: Fixed) -> Context:
    return Context(s.last, s.history, s.cache.length + 1, fixed.sampling, s.features)


def _choose(s: SpecState, fixed: Fixed, st: Static):
    """The next step's drafter context int32[B] and index into ks."""
    zero = jnp.zeros((), jnp.int32)
    if not st.adaptive:
        return jnp.zeros_like(s.last), zero
    context = st.drafter.context(fixed.dparams, s.dstate, _context_of(s, fixed))
    chosen = policy.choose(s.est, st.ks, fixed.costs, context, ~s.done)
    return context, jnp.where(fixed.force >= 0, fixed.force, chosen).astype(jnp.int32)


def _count(a: AcceptCounts, active, n, k_now: int, choice: int, drafted) -> AcceptCounts:
    """k_now: the step's K or tree depth; drafted int32[B]: its drafts (a tree's nodes)."""
    K = a.per_position.shape[0]
    idx = jnp.arange(K, dtype=jnp.int32)[None]
    return AcceptCounts(steps=a.steps + active.sum(), accepted=a.accepted + jnp.where(active, n, 0).sum(),
                        drafted=a.drafted + jnp.where(active, drafted, 0).sum(),
                        per_position=a.per_position + (active[:, None] & (idx < n[:, None])).sum(0),
                        drafted_per_position=a.drafted_per_position + (active[:, None] & (idx < k_now)).sum(0),
                        k_steps=a.k_steps.at[choice].add(1))


def _step(choice: int, s: SpecState, fixed: Fixed, st: Static) -> SpecState:
    """One step with the arm ks[choice] (static): a chain of K drafts or a Tree."""
    arm, P = st.ks[choice], st.width
    k_now = policy.arm_length(arm)
    key, k_step = jax.random.split(s.key)
    ctx = _context_of(s, fixed)
    if isinstance(arm, Tree):
        n, emitted, new_cache, dstate, hidden = tree_step(
            fixed.params, fixed.dparams, s.cache, s.dstate, ctx, k_step, cfg=st.cfg, drafter=st.drafter,
            tree=arm, width=P)
        drafted = jnp.full_like(n, arm.budget)
    else:
        n, emitted, new_cache, dstate, hidden = spec_step(
            fixed.params, fixed.dparams, s.cache, s.dstate, ctx, k_step,
            live_slots(s.cache, s.done, k_now + 1, st.live_attention), _sync_flag(fixed, st, k_now), cfg=st.cfg,
            drafter=st.drafter, num_draft=k_now, width=P)
        drafted = jnp.full_like(n, k_now)
    idx = jnp.arange(P, dtype=jnp.int32)
    eos_at = jnp.isin(emitted, fixed.eos_ids) & (idx[None] <= n[:, None])
    upto_eos = jnp.where(eos_at.any(1), jnp.argmax(eos_at, axis=1) + 1, P)
    count = jnp.where(s.done, 0, jnp.minimum(jnp.minimum(n + 1, upto_eos), fixed.limits - s.count))
    if st.stream:
        streaming.send(fixed.stream_id, s.steps, emitted, count)
    active = ~s.done
    committed = st.drafter.commit(fixed.dparams, dstate, ctx, jnp.where(s.done, 0, n))
    check_state(st.drafter, dstate, committed, "commit")
    new = s._replace(
        cache=rollback(new_cache, jnp.where(s.done, s.cache.length, s.cache.length + n + 1)),
        dstate=committed,
        last=jnp.where(s.done, s.last, rowwise.gather(emitted, n)),
        history=emit(s.history, ctx.history_len, emitted, count), count=s.count + count,
        done=s.done | (eos_at.any(1) & (upto_eos <= count)) | (s.count + count >= fixed.limits),
        key=key, steps=s.steps + 1, acc=_count(s.acc, active, n, k_now, choice, drafted), features=hidden,
        est=_estimate(s, arm, n, active, st))
    context, choice_next = _choose(new, fixed, st)
    return new._replace(context=context, choice=choice_next)


def _sync_flag(fixed: Fixed, st: Static, k_now: int):
    """The traced sync switch of a K = 0 step, or None where there is nothing to skip (no sync)."""
    return fixed.sync if k_now == 0 and type(st.drafter).sync is not Drafter.sync else None


def _estimate(s: SpecState, arm, n, active, st: Static) -> policy.Estimate:
    if not st.adaptive:
        return s.est
    if isinstance(arm, Tree):
        return policy.update_tree(s.est, n, active, s.context)
    return policy.update(s.est, jnp.int32(arm), n, active, s.context)


def _initial_state(fixed: Fixed, st: Static, tokens, lengths, cache, key, first, prompt_features, prior) -> SpecState:
    B, T = tokens.shape
    P, K = st.width, st.width - 1
    history = jnp.zeros((B, cache.capacity + P), jnp.int32).at[:, :T].set(tokens)
    zero = jnp.zeros((), jnp.int32)
    # the features of the pass that made `first` (the prompt's last position) wait at index 0
    features = jnp.zeros((len(st.drafter.hidden_layers), B, P, st.cfg.hidden_size), fixed.params["embed"].dtype)
    last_pos = jnp.take_along_axis(prompt_features, (lengths - 1)[None, :, None, None], axis=2)
    count = jnp.ones((B,), jnp.int32)
    s = SpecState(cache=cache, last=first, history=rowwise.scatter(history, lengths, first), count=count,
                  done=jnp.isin(first, fixed.eos_ids) | (count >= fixed.limits),
                  dstate=st.drafter.init(fixed.dparams, tokens, lengths, cache.capacity, prompt_features),
                  key=key, steps=zero,
                  acc=AcceptCounts(zero, zero, zero, jnp.zeros((K,), jnp.int32), jnp.zeros((K,), jnp.int32),
                                   jnp.zeros((len(st.ks),), jnp.int32)),
                  features=features.at[:, :, :1].set(last_pos.astype(features.dtype)),
                  est=policy.init_estimate(prior), context=jnp.zeros((B,), jnp.int32), choice=zero)
    context, choice = _choose(s, fixed, st)
    return s._replace(context=context, choice=choice)


def speculative(params, dparams, tokens, lengths, limits, cache, sampling, eos_ids, key, first, prompt_features,
                costs, prior, force, sync, max_steps, stream_id, *, cfg, drafter, ks, capacity_out, live_attention,
                stream=False):
    """After prefill (first int32[B], prompt_features [N, B, T, E]), steps until every row is done.

    ks: the arms of this loop (static): chain K values (int) and at most one Tree. One arm: fixed,
    one lax.while_loop. Several (adaptive): policy.choose picks each step's arm from the acceptance
    estimates (starting at prior float32[C], one per drafter context) and costs float32[len(ks)]
    (plain steps), at the end of the step before. For the cost timing (costs.py) this same program
    runs with force int32 >= 0 (every step takes the arm ks[force]), sync bool False (K = 0 steps skip
    the drafter's sync: plain steps) and max_steps int32 (it stops after that many steps). stream
    (static): each step sends its tokens to the host stream stream_id (jaxspec/streaming.py). An outer loop runs one inner while_loop per K in turn, each running steps while
    the choice is its K: a lax.switch around every step cost 4-7% of a plain step on XLA CPU, and a
    switch between the inner loops made XLA copy the KV cache on each entry into a K > 0 loop.
    -> (out int32[B, N+K+1], count int32[B], steps, AcceptCounts, cache). The loop keeps one token
    buffer, `history` (prompt + output per row); the output is cut from it at the end."""
    TRACES["speculative"] += 1
    fixed = Fixed(params, dparams, limits, eos_ids, sampling, costs, force, sync, max_steps, stream_id)
    st = Static(cfg, drafter, tuple(ks), max(policy.arm_length(arm) for arm in ks) + 1, live_attention, stream)
    state = _initial_state(fixed, st, tokens, lengths, cache, key, first, prompt_features, prior)

    going = lambda s: ~jnp.all(s.done) & (s.steps < max_steps)

    def while_chosen(choice: int, s: SpecState) -> SpecState:
        return jax.lax.while_loop(lambda s: going(s) & (s.choice == choice),
                                  functools.partial(_step, choice, fixed=fixed, st=st), s)

    if st.adaptive:
        def each_k_in_turn(s):
            for i in range(len(ks)):
                s = while_chosen(i, s)
            return s
        state = jax.lax.while_loop(going, each_k_in_turn, state)
    else:
        state = while_chosen(0, state)
    width = capacity_out + st.width
    cols = lengths[:, None] + jnp.arange(width, dtype=jnp.int32)[None]
    out = jnp.take_along_axis(state.history, jnp.minimum(cols, state.history.shape[1] - 1), axis=1)
    out = jnp.where(jnp.arange(width)[None] < state.count[:, None], out, -1)
    return out, state.count, state.steps, state.acc, state.cache
