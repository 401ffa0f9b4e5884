"""Adaptive speculation: choose K each step from running acceptance estimates and measured costs.

A step with K drafts emits (1 - a^(K+1)) / (1 - a) tokens per row on average (Leviathan et al.
2023, eq. 1, a = per-token acceptance) and costs c_K plain decode steps, measured once per (model,
drafter, batch size, sampling kind) at start-up. Each step takes the K in a small candidate set
that maximises the expected tokens per cost of the batch's worst active row; K = 0 is a plain
target step (the drafter only keeps its state in sync).

Acceptance is estimated per drafter context (Drafter.context: e.g. the length of NGram's match;
one context for model drafters): the geometric-run maximum likelihood, accepted / trials, with
trials = drafts up to and including the first rejection, decayed per observation so it follows the
text, and starting from the drafter's prior (a shipped head's held-out acceptance). When K = 0 is
chosen no evidence comes in, so after some plain steps one step probes with the best K > 0. The
wait is the probe's expected loss under the current estimate (its cost less the plain steps its
expected tokens would take) over PROBE_BUDGET: an estimate just below break-even is probed again
after a step or two, a hopeless one rarely, and probes cost about PROBE_BUDGET of the plain steps.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .analysis import acceptance_to_pay, expected_tokens
from .tree import Tree

DECAY = 0.95                # weight of a context's past evidence, per new observation of it
PRIOR_TRIALS = 2.0          # weight of the prior, in drafts
PROBE_BUDGET = 0.02         # expected loss of probes, as a share of the plain steps between them
MIN_WAIT, MAX_WAIT = 1, 256  # plain steps before a probe
A_MAX = 0.999               # estimates are kept below 1: a run of accepts is no proof of a = 1
PROBE_FLOOR = 0.05          # no probe while an active row's context is below this (NGram without a match)
SYNC_TOLERANCE = 0.05       # a K = 0 step this close to a plain step's cost counts as free: the spread of
                            # the measurement (EAGLE's and the draft model's, no model pass: 0.98-1.03)


def candidates(num_draft: int) -> tuple[int, ...]:
    """The K values one loop switches between for a largest K: 0, 2, K // 2 and K (1 only for K = 1).

    Each K is one more target pass to compile (4-7 s for SmolLM2 on 2 CPU cores). K = 1 is left out:
    it beats K = 2 only where a^2 / (1 + a) < (c2 - c1) / c1 and K = 0 only where (1 + a) c0 > c1
    (a: acceptance, cK: step costs in plain steps), i.e. where a second draft costs much more than
    the first: at this CPU's EAGLE costs (1.0, 1.52, 1.62) never (a < 0.29 and a > 0.52), and the
    adaptive runs of benchmarks/suffix-adaptive-*.json chose it in 4 of 3,671 steps."""
    return tuple(sorted({0, num_draft, min(2, num_draft), max(num_draft // 2, min(2, num_draft))}))


class Estimate(NamedTuple):
    accepted: jax.Array     # float32[C]: decayed accepted drafts per context
    trials: jax.Array       # float32[C]: decayed drafts tested (up to and including the first rejection)
    plain_run: jax.Array    # int32: consecutive K = 0 steps
    tree_tokens: jax.Array  # float32[C]: decayed tokens emitted by tree steps
    tree_steps: jax.Array   # float32[C]: decayed tree steps
    since_tree: jax.Array   # int32: steps since the last tree step


def init_estimate(prior) -> Estimate:
    """prior float32[C]: assumed acceptance per context before any evidence (weight PRIOR_TRIALS)."""
    prior = jnp.asarray(prior, jnp.float32)
    zeros = jnp.zeros_like(prior)
    return Estimate(prior * PRIOR_TRIALS, jnp.full_like(prior, PRIOR_TRIALS), jnp.int32(0), zeros, zeros, jnp.int32(0))


def arm_length(arm) -> int:
    """The most drafts one step of an arm can keep: K for a chain, the depth for a Tree."""
    return arm.depth if isinstance(arm, Tree) else int(arm)


def expected_per_arm(est: Estimate, ks: tuple, a: jax.Array, context: jax.Array) -> jax.Array:
    """float32[B, len(ks)]: expected tokens per step of each arm (chain K or Tree) for rows of
    acceptance a [B]. A chain's is Leviathan et al.'s (1 - a^(K+1)) / (1 - a); a tree's is the
    decayed mean of its own steps, and at least the chain's of its depth (the tree holds the
    drafter's likeliest path, EAGLE-2 / tree.grow_tree), which is all there is before a tree step."""
    k = jnp.asarray([arm_length(arm) for arm in ks], jnp.float32)
    per_row = expected_tokens(jnp.clip(a, 0.0, A_MAX)[:, None], k[None])
    seen = est.tree_tokens[context] / jnp.maximum(est.tree_steps[context], 1e-6)   # [B]
    is_tree = jnp.asarray([isinstance(arm, Tree) for arm in ks])
    return jnp.where(is_tree[None] & (est.tree_steps[context] > 0)[:, None], jnp.maximum(per_row, seen[:, None]),
                     per_row)


def choose(est: Estimate, ks: tuple, costs: jax.Array, context: jax.Array, active: jax.Array) -> jax.Array:
    """Index into ks of the arm for this step: a chain's K (int) or a Tree. costs float32[len(ks)]:
    each arm's step cost in plain steps; context int32[B]: each row's drafter context; active bool[B]:
    rows still generating.

    The batch finishes when its last row does, so a step is judged by its worst active row: the arm
    that maximises that row's expected tokens per cost. Summing over rows instead let rows with long
    NGram matches buy K > 0 steps that slowed the rows without one (batch 16: 0.9x plain)."""
    a = est.accepted[context] / est.trials[context]                              # [B]
    per_row = jnp.where(active[:, None], expected_per_arm(est, ks, a, context), jnp.inf)   # [B, len(ks)]
    tokens = jnp.where(jnp.any(active), per_row.min(0), 1.0)                    # [len(ks)]
    rate = tokens / costs
    best = jnp.argmax(rate).astype(jnp.int32)
    if ks[0] != 0:
        return _probe_tree(est, ks, costs, tokens, best)
    spec = (1 + jnp.argmax(rate[1:])).astype(jnp.int32)                         # the best K > 0
    loss = costs[spec] - tokens[spec] * costs[0]           # >= 0 when K = 0 is best: time lost by probing
    wait = jnp.clip(jnp.ceil(loss / PROBE_BUDGET), MIN_WAIT, MAX_WAIT)
    # a probe can only change the choice if it could lift the worst row: none may sit below the floor
    probeable = jnp.any(active) & jnp.all(~active | (a >= PROBE_FLOOR))
    probe = (best == 0) & (est.plain_run >= wait) & probeable
    return _probe_tree(est, ks, costs, tokens, jnp.where(probe, spec, best))


def _probe_tree(est: Estimate, ks: tuple, costs, tokens, choice):
    """A tree is judged by its own steps only, so while chains win it would never be tried again: after
    some chain steps, one tree step probes it, the wait set as for K = 0 probes (its expected loss
    against the chosen chain over PROBE_BUDGET of the time between probes)."""
    trees = [i for i, arm in enumerate(ks) if isinstance(arm, Tree)]
    if not trees:
        return choice
    t = trees[0]
    loss = costs[t] - tokens[t] * costs[choice] / tokens[choice]       # plain steps lost by the probe
    wait = jnp.clip(jnp.ceil(loss / (PROBE_BUDGET * costs[choice])), MIN_WAIT, MAX_WAIT)
    is_chain = jnp.asarray([not isinstance(arm, Tree) and arm > 0 for arm in ks])[choice]
    return jnp.where(is_chain & (est.since_tree >= wait), t, choice).astype(jnp.int32)


def update(est: Estimate, K: jax.Array, num_accepted: jax.Array, active: jax.Array,
           context: jax.Array) -> Estimate:
    """Fold one step in: K drafts (traced int), num_accepted int32[B], active bool[B], context int32[B]."""
    tried = jnp.where(num_accepted < K, num_accepted + 1, num_accepted)
    live = active & (K > 0)
    zeros = jnp.zeros_like(est.accepted)
    seen = zeros.at[context].add(live.astype(jnp.float32)) > 0
    acc = jnp.where(seen, DECAY * est.accepted, est.accepted) + zeros.at[context].add(jnp.where(live, num_accepted, 0))
    trials = jnp.where(seen, DECAY * est.trials, est.trials) + zeros.at[context].add(jnp.where(live, tried, 0))
    return est._replace(accepted=acc, trials=trials, plain_run=jnp.where(K == 0, est.plain_run + 1, 0),
                        since_tree=est.since_tree + jnp.where(K > 0, 1, 0))


def update_tree(est: Estimate, num_accepted: jax.Array, active: jax.Array, context: jax.Array) -> Estimate:
    """Fold in one tree step: its tokens (num_accepted + 1) per active row, by context."""
    zeros = jnp.zeros_like(est.tree_tokens)
    seen = zeros.at[context].add(active.astype(jnp.float32)) > 0
    tokens = jnp.where(seen, DECAY * est.tree_tokens, est.tree_tokens) + \
        zeros.at[context].add(jnp.where(active, num_accepted + 1, 0).astype(jnp.float32))
    steps = jnp.where(seen, DECAY * est.tree_steps, est.tree_steps) + zeros.at[context].add(active.astype(jnp.float32))
    return est._replace(tree_tokens=tokens, tree_steps=steps, plain_run=jnp.int32(0), since_tree=jnp.int32(0))


def speculation_can_pay(ks: tuple, costs, prior, errors=None) -> bool:
    """Whether to run the adaptive loop at all (costs float32[len(ks)], prior float32[C], e.g. a
    head's held-out acceptance; errors float32[len(ks)]: the costs' standard errors). True when, for
    some drafter context, the prior makes some K > 0 worth more tokens per cost than a plain step;
    or when a K = 0 step (plain step plus the drafter's sync) costs at most 1 + SYNC_TOLERANCE plain
    steps, within two standard errors, and some K could pay at full acceptance: waiting at K = 0
    then costs little more than the probes, which find out whether the text is easier than the
    prior. Otherwise the loop would pay for the sync in every plain step; on this project's CPU that
    lost 8-17% (docs/history.md)."""
    prior, costs = np.asarray(prior, np.float32), np.asarray(costs, np.float32)
    errors = np.zeros_like(costs) if errors is None else np.asarray(errors, np.float32)
    lengths = [arm_length(arm) for arm in ks]
    pays = lambda a: any(k > 0 and float(np.max(expected_tokens(np.clip(a, 0.0, A_MAX), k))) / c > 1.0
                         for k, c in zip(lengths, costs))
    cheap_wait = ks[0] == 0 and costs[0] - 2.0 * errors[0] <= 1.0 + SYNC_TOLERANCE
    return pays(prior) or (cheap_wait and pays(np.ones_like(prior)))


def why_plain(ks: tuple, costs, prior) -> str:
    """One line on why speculation did not run: what each arm costs on this machine (plain steps),
    the per-token acceptance it needs to pay (analysis.acceptance_to_pay), and the drafter's prior."""
    def need(arm, cost: float) -> str:
        name, most = ("a tree" if isinstance(arm, Tree) else f"K={arm}"), arm_length(arm) + 1
        if cost >= most:
            return f"{name} costs {cost:.2f}, more than the {most} tokens it can emit"
        return f"{name} costs {cost:.2f} and needs {acceptance_to_pay(most - 1, cost):.2f}"
    needs = ", ".join(need(arm, float(c)) for arm, c in zip(ks, costs) if arm_length(arm) > 0)
    return (f"on this machine a step of {needs} (plain steps; per-token acceptance); the drafter's prior "
            f"acceptance is at most {float(np.max(prior)):.2f}")
