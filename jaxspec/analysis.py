"""Closed-form speed model and Monte-Carlo checks for speculative decoding (numpy; expected_tokens
also runs on jax arrays, inside jit, for the adaptive policy).

Formulas are from Leviathan, Kalman & Matias 2023, "Fast Inference from Transformers via
Speculative Decoding" (section 3). Notation: `a` is the acceptance rate (the paper's alpha, the
chance that one draft token is accepted, treated as i.i.d. per position), `K` the number of draft
tokens per target pass (the paper's gamma), `c` the cost of one draft step divided by the cost of
one target step. Shape letters: B batch, K draft tokens, V vocabulary.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _check_a(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    if np.any((a < 0) | (a > 1)) or np.any(np.isnan(a)):
        raise ValueError("acceptance rate a must lie in [0, 1]")
    return a


def expected_tokens(a, K):
    """Expected tokens emitted per target pass: (1 - a^(K+1)) / (1 - a) (paper, eq. 1).

    a, K broadcast against each other: numpy arrays or scalars (checked: a in [0, 1], K >= 0), or
    jax arrays (unchecked, traceable; policy.choose). The a -> 1 limit, K + 1, is returned exactly;
    near 1 the numerator is evaluated as -expm1((K+1) log a) so it does not cancel.
    """
    xp = jnp if isinstance(a, jax.Array) or isinstance(K, jax.Array) else np
    if xp is np:
        a, K = _check_a(a), np.asarray(K)
        if np.any(K < 0):
            raise ValueError("K must be >= 0")
    gap = 1.0 - a                                   # exact for a in [0.5, 1] (Sterbenz)
    safe_gap = xp.where(gap == 0, 1.0, gap)
    with np.errstate(divide="ignore"):
        # 1 - a^(K+1) = -expm1((K+1) log a); log 0 = -inf gives a^(K+1) = 0 at a = 0.
        num = -xp.expm1((K + 1) * xp.log(a))
    out = xp.where(gap == 0, K + 1.0, num / safe_gap)
    return out[()] if xp is np and out.ndim == 0 else out


def walltime_improvement(a, K, c):
    """Expected wall-time speedup over plain decoding: (1 - a^(K+1)) / ((1 - a)(K c + 1)).

    Paper, theorem 3.8: a target pass plus K draft steps costs K c + 1 target steps and emits
    expected_tokens(a, K) tokens. Broadcasts over a, K, c.
    """
    c = np.asarray(c, dtype=np.float64)
    if np.any(c < 0):
        raise ValueError("cost ratio c must be >= 0")
    out = expected_tokens(a, K) / (np.asarray(K) * c + 1.0)
    return out[()] if np.ndim(out) == 0 else out


def best_k(a: float, c: float, k_max: int = 16) -> tuple[int, float]:
    """(K, improvement) maximising walltime_improvement(a, K, c) over K in 1..k_max.

    Returns (0, 1.0), i.e. plain decoding, when no K gives an improvement above 1 (for K = 1 that
    needs a > c, and a <= c rules out every K since each a^i <= a <= c). Ties go to the smaller K.
    """
    if k_max < 1:
        raise ValueError("k_max must be >= 1")
    ks = np.arange(1, k_max + 1)
    imp = walltime_improvement(float(a), ks, float(c))
    i = int(np.argmax(imp))
    if imp[i] <= 1.0:
        return 0, 1.0
    return int(ks[i]), float(imp[i])


def break_even_acceptance(K: int, c: float, tol: float = 1e-12) -> float:
    """The acceptance a in [0, 1) where walltime_improvement(a, K, c) == 1, by bisection.

    The improvement rises strictly with a, from 1 / (K c + 1) at a = 0 to (K + 1) / (K c + 1) at
    a = 1, so the root is unique when 0 < c < 1. Edge cases: c == 0 returns 0.0 (free drafts never
    lose); c >= 1 returns 1.0, meaning no acceptance below 1 pays off (at c == 1 only a = 1 breaks
    even, for c > 1 nothing does). Speculating pays for a above the returned value.
    """
    if K < 1:
        raise ValueError("K must be >= 1")
    if c < 0:
        raise ValueError("cost ratio c must be >= 0")
    if c == 0:
        return 0.0
    if c >= 1:
        return 1.0
    return acceptance_to_pay(K, K * c + 1.0, tol)


def acceptance_to_pay(K: int, step_cost: float, tol: float = 1e-12) -> float:
    """The per-token acceptance a at which a step of K drafts that costs step_cost plain steps emits
    as many tokens as the plain steps it costs: expected_tokens(a, K) == step_cost, by bisection
    (expected_tokens rises strictly from 1 at a = 0 to K + 1 at a = 1). 0.0 for step_cost <= 1;
    1.0 when even a = 1 does not pay (step_cost >= K + 1)."""
    if step_cost <= 1.0:
        return 0.0
    if step_cost >= K + 1:
        return 1.0
    lo, hi = 0.0, 1.0                               # expected_tokens(lo) < step_cost < expected_tokens(hi)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if expected_tokens(mid, K) < step_cost:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def tvd(p, q):
    """Total variation distance 0.5 * sum |p - q| over the last axis ([..., V] -> [...])."""
    return 0.5 * np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)).sum(axis=-1)


def acceptance_probability(p, q):
    """Chance that one draft x ~ q is accepted by target p: sum_x min(p, q) = 1 - tvd(p, q).

    Paper, definition 3.1 and corollary 3.6 (alpha = 1 - D_LK(p, q)). p, q: [..., V].
    """
    return np.minimum(np.asarray(p, np.float64), np.asarray(q, np.float64)).sum(axis=-1)


def _normalise(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1 or np.any(x < 0) or x.sum() <= 0:
        raise ValueError("a distribution must be a non-negative [V] vector with positive mass")
    return x / x.sum()


def simulate_rejection(p, q, num_samples: int, seed: int = 0) -> np.ndarray:
    """Empirical distribution [V] of the first token one speculative step emits.

    Paper, algorithm 1 / theorem 3.5: draw x ~ q, keep it with probability min(1, p(x) / q(x)),
    otherwise emit a draw from norm(max(0, p - q)). The result converges to p whatever q is.
    p, q: [V] target and draft distributions (normalised here). When p == q the residual has no
    mass; any rejection is then float rounding and is redrawn from p, so no NaN can appear.
    """
    p, q = _normalise(p), _normalise(q)
    if p.shape != q.shape:
        raise ValueError("p and q must have the same vocabulary size")
    V = p.shape[0]
    rng = np.random.default_rng(seed)
    x = rng.choice(V, size=num_samples, p=q)                    # drafts, q[x] > 0
    keep = rng.random(num_samples) < np.minimum(1.0, p[x] / q[x])
    residual = np.maximum(0.0, p - q)
    mass = residual.sum()
    residual = residual / mass if mass > 1e-12 else p
    fixes = rng.choice(V, size=int((~keep).sum()), p=residual)
    emitted = x.copy()
    emitted[~keep] = fixes
    return np.bincount(emitted, minlength=V) / num_samples


def simulate_block(accept_mask):
    """Emission rule for one verified block: keep drafts up to the first rejection, add one token.

    accept_mask: bool [K] or [B, K], whether each draft would pass its test on its own. Returns
    (num_accepted, emitted, rolled_back) with emitted = num_accepted + 1 (accepted drafts plus the
    correction, or the bonus token when all K pass) and rolled_back = K - num_accepted cache slots
    discarded. Ints for [K], int arrays [B] for [B, K].
    """
    mask = np.asarray(accept_mask, dtype=bool)
    K = mask.shape[-1]
    n = np.cumprod(mask, axis=-1).sum(axis=-1)
    if n.ndim == 0:
        n = int(n)
    return n, n + 1, K - n


def simulate_decode(a: float, K: int, steps: int, seed: int = 0) -> dict:
    """Monte-Carlo of `steps` target passes, each draft accepted i.i.d. with probability a.

    Each pass keeps drafts until the first rejection (simulate_block). Returns mean_accepted
    (accepted drafts per pass), tokens_per_step (mean_accepted + 1; compare expected_tokens),
    acceptance_rate (accepted / drafted) and per_position_acceptance [K] (fraction of passes whose
    draft i was kept; its expectation is a^(i+1)).
    """
    a = float(_check_a(a))
    rng = np.random.default_rng(seed)
    kept = np.cumprod(rng.random((steps, K)) < a, axis=1)      # [steps, K]
    accepted = kept.sum(axis=1)                                 # [steps]
    return {
        "mean_accepted": float(accepted.mean()),
        "tokens_per_step": float(accepted.mean() + 1.0),
        "acceptance_rate": float(accepted.sum() / (steps * K)),
        "per_position_acceptance": kept.mean(axis=0),
    }


def speedup_table(alphas, K: int, c: float) -> list[dict]:
    """Rows {"a", "expected_tokens", "improvement"} for each acceptance rate in alphas."""
    return [{"a": float(a), "expected_tokens": float(expected_tokens(a, K)),
             "improvement": float(walltime_improvement(a, K, c))} for a in alphas]
