"""Adaptive speculation: choose K each step from the running acceptance estimate and measured costs.

A step with K drafts emits (1 - a^(K+1)) / (1 - a) tokens on average (Leviathan et al. 2023, eq. 1,
a = per-token acceptance) and costs c_K plain decode steps, measured once per (model, drafter,
batch, cache size) at start-up. Each step takes the K in a small candidate set that maximises
tokens per cost; K = 0 is a plain target step (the drafter only keeps its state in sync).

The estimate of a is the geometric-run maximum likelihood, accepted / trials, with trials = drafts
up to and including the first rejection, decayed each step so it follows the text. When K = 0 is
chosen no evidence comes in, so a probe step with the smallest K > 0 runs after `wait` plain steps;
`wait` doubles after each probe that finds nothing and resets when speculation is chosen again.
"""
from __future__ import annotations

import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

DECAY = 0.9                 # weight of the past in the acceptance estimate, per step
PRIOR = (1.0, 2.0)          # (accepted, trials) before any evidence: a = 0.5
FIRST_WAIT, MAX_WAIT = 8, 256


def candidates(num_draft: int) -> tuple[int, ...]:
    """The K values one loop switches between for a largest K: 0, 1, 2, K // 2 and K."""
    return tuple(sorted({0, 1, min(2, num_draft), num_draft // 2, num_draft}))


class Estimate(NamedTuple):
    accepted: jax.Array     # float32: decayed accepted drafts
    trials: jax.Array       # float32: decayed drafts tested (up to and including the first rejection)
    plain_run: jax.Array    # int32: consecutive K = 0 steps
    wait: jax.Array         # int32: plain steps before the next probe


def init_estimate() -> Estimate:
    return Estimate(jnp.float32(PRIOR[0]), jnp.float32(PRIOR[1]), jnp.int32(0), jnp.int32(FIRST_WAIT))


def expected_tokens(a: jax.Array, ks: jax.Array) -> jax.Array:
    """(1 - a^(K+1)) / (1 - a) per candidate K (a < 1 kept away from 1)."""
    a = jnp.clip(a, 0.0, 0.999)
    return (1.0 - a ** (ks + 1)) / (1.0 - a)


def choose(est: Estimate, ks: tuple, costs: jax.Array) -> jax.Array:
    """Index into ks of the K for this step. costs float32[len(ks)]: c_K in plain steps."""
    k = jnp.asarray(ks, jnp.float32)
    best = jnp.argmax(expected_tokens(est.accepted / est.trials, k) / costs).astype(jnp.int32)
    if ks[0] != 0:
        return best
    probe = (best == 0) & (est.plain_run >= est.wait)
    return jnp.where(probe, 1, best)


def update(est: Estimate, K: jax.Array, num_accepted: jax.Array, active: jax.Array) -> Estimate:
    """Fold one step in: K drafts (traced int), num_accepted int32[B], active bool[B] (rows still going)."""
    tried = jnp.where(num_accepted < K, num_accepted + 1, num_accepted)
    live = active & (K > 0)
    acc = DECAY * est.accepted + jnp.where(live, num_accepted, 0).sum()
    trials = DECAY * est.trials + jnp.where(live, tried, 0).sum()
    keep = K == 0
    was_probe = (K > 0) & (est.plain_run >= est.wait)
    wait = jnp.where(was_probe & (jnp.where(live, num_accepted, 0).sum() == 0),
                     jnp.minimum(2 * est.wait, MAX_WAIT), est.wait)
    wait = jnp.where((K > 0) & ~was_probe, FIRST_WAIT, wait)
    return Estimate(jnp.where(keep, est.accepted, acc), jnp.where(keep, est.trials, trials),
                    jnp.where(keep, est.plain_run + 1, 0), wait.astype(jnp.int32))


_COSTS: dict = {}


def _time(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return best


def measure_costs(key: tuple, plain_step, spec_step, args: tuple, ks: tuple, repeats: int = 5) -> dict:
    """Cost of one step with each candidate K in plain steps, measured once per key (cached).

    plain_step(*args) is a target step without a drafter; spec_step(K)(*args) a full step with K
    drafts (K = 0: plain plus the drafter's sync). Each is compiled and timed alone (best of
    `repeats`). K = 0, 1 and the largest K are measured; K in between is interpolated linearly
    (drafting and verifying grow about linearly in K), which saves a compilation per K.
    -> {"costs": float32[len(ks)], "plain_seconds": float, "seconds": time spent here}."""
    if key in _COSTS:
        return {**_COSTS[key], "seconds": 0.0}
    start = time.perf_counter()
    plain = _time(jax.jit(plain_step), args, repeats)
    ends = sorted({k for k in ks if k <= 1} | {max(ks)})
    timed = {k: _time(jax.jit(spec_step(k)), args, repeats) / plain for k in ends}
    pos = [k for k in ends if k > 0]
    costs = np.asarray([timed[k] if k in timed else np.interp(k, pos, [timed[j] for j in pos]) for k in ks],
                       np.float32)
    _COSTS[key] = {"costs": costs, "plain_seconds": plain}
    return {**_COSTS[key], "seconds": time.perf_counter() - start}


def speculation_can_pay(ks: tuple, costs) -> bool:
    """False when even accepting every draft (K + 1 tokens a step) is slower than plain decoding."""
    return any(k > 0 and (k + 1) / c > 1.0 for k, c in zip(ks, np.asarray(costs)))
