"""jaxspec.analysis: the speed model of Leviathan et al. 2023 and Monte-Carlo checks of it.

Reproduces five checks from the reference write-up: (1) rejection sampling recovers the target,
(2) the emission rule after a rejection, (3) the speedup table at c = 0.05, (4) a slowdown of
about 0.878x for a poor, costly drafter, (5) a 1,000-step simulated decode.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from jaxspec.analysis import (
    acceptance_probability,
    best_k,
    break_even_acceptance,
    expected_tokens,
    simulate_block,
    simulate_decode,
    simulate_rejection,
    speedup_table,
    tvd,
    walltime_improvement,
)


def _softmax(logits):
    e = np.exp(logits - logits.max())
    return e / e.sum()


# (1) Rejection sampling is lossless: emitted tokens follow p, not q.
def test_rejection_sampling_recovers_target():
    V = 10
    p = _softmax(np.random.default_rng(1).normal(size=V))
    q = _softmax(np.random.default_rng(2).normal(size=V))
    assert tvd(p, q) > 0.1                                  # the drafter really is different
    emp = simulate_rejection(p, q, 50_000, seed=0)
    assert emp.shape == (V,) and math.isclose(emp.sum(), 1.0)
    # Sampling noise alone gives about 0.5 * sqrt(2 / (pi n)) * sum sqrt(p (1 - p)) ~ 0.005.
    assert tvd(emp, p) < 0.02
    assert tvd(emp, q) > 0.1                                # not just the draft distribution
    assert math.isclose(acceptance_probability(p, q), 1.0 - tvd(p, q))


def test_rejection_sampling_identical_distributions():
    p = _softmax(np.random.default_rng(3).normal(size=10))
    emp = simulate_rejection(p, p.copy(), 50_000, seed=0)
    assert not np.any(np.isnan(emp))
    assert tvd(emp, p) < 0.02
    assert acceptance_probability(p, p) == pytest.approx(1.0)


# (2) K = 5, the third draft rejected: 2 drafts + 1 correction emitted, 3 slots rolled back,
# even though drafts 4 and 5 would have passed their own tests.
def test_rejection_at_third_draft():
    num_accepted, emitted, rolled_back = simulate_block([True, True, False, True, True])
    assert (num_accepted, emitted, rolled_back) == (2, 3, 3)
    assert simulate_block([True] * 5) == (5, 6, 0)          # all pass: 5 drafts + bonus token
    assert simulate_block([False] * 5) == (0, 1, 5)
    n, e, r = simulate_block(np.array([[1, 1, 0, 1, 1], [1, 1, 1, 1, 0]], bool))   # [B, K]
    assert n.tolist() == [2, 4] and e.tolist() == [3, 5] and r.tolist() == [3, 1]


# (3) Speedup table, K = 5, c = 0.05, so K c + 1 = 1.25. By hand:
#   a=0.5: 0.5^6 = 0.015625, (1 - 0.015625) / 0.5 = 1.96875, / 1.25 = 1.575
#   a=0.6: 0.6^6 = 0.046656, 0.953344 / 0.4 = 2.38336,       / 1.25 = 1.906688
#   a=0.7: 0.7^6 = 0.117649, 0.882351 / 0.3 = 2.94117,       / 1.25 = 2.352936
#   a=0.8: 0.8^6 = 0.262144, 0.737856 / 0.2 = 3.68928,       / 1.25 = 2.951424
#   a=0.9: 0.9^6 = 0.531441, 0.468559 / 0.1 = 4.68559,       / 1.25 = 3.748472
HAND = {0.5: (1.96875, 1.575), 0.6: (2.38336, 1.906688), 0.7: (2.94117, 2.352936),
        0.8: (3.68928, 2.951424), 0.9: (4.68559, 3.748472)}


def test_speedup_table_matches_hand_values():
    rows = speedup_table(sorted(HAND), K=5, c=0.05)
    assert [r["a"] for r in rows] == sorted(HAND)
    for r in rows:
        tokens, improvement = HAND[r["a"]]
        assert r["expected_tokens"] == pytest.approx(tokens, rel=1e-9)
        assert r["improvement"] == pytest.approx(improvement, rel=1e-9)


@pytest.mark.parametrize("a", sorted(HAND))
def test_speedup_matches_monte_carlo(a):
    K, c = 5, 0.05
    sim = simulate_decode(a, K, steps=100_000, seed=int(a * 10))
    assert sim["tokens_per_step"] / (K * c + 1) == pytest.approx(walltime_improvement(a, K, c), rel=0.02)


# (4) A poorly aligned, costly drafter slows decoding down to about 0.878x. Chosen values:
#   a=0.3,  K=1, c=0.48: (1 + 0.3) / (1 + 0.48) = 1.3 / 1.48 = 0.878378...
#   a=0.05, K=4, c=0.05: (1 + .05 + .0025 + .000125 + .00000625) / 1.2 = 1.05263125 / 1.2 = 0.877193
# Both have c >= a, so no K helps and best_k falls back to plain decoding.
@pytest.mark.parametrize("a,K,c,hand", [(0.3, 1, 0.48, 0.878378), (0.05, 4, 0.05, 0.877193)])
def test_poor_drafter_slows_down(a, K, c, hand):
    w = walltime_improvement(a, K, c)
    assert w < 1.0
    assert w == pytest.approx(0.878, abs=0.005)
    assert w == pytest.approx(hand, abs=1e-6)
    assert best_k(a, c) == (0, 1.0)
    assert break_even_acceptance(K, c) > a


# (5) 1,000 simulated target passes at a = 0.8, K = 4: expected tokens (1 - 0.8^5) / 0.2 = 3.3616,
# acceptance (3.3616 - 1) / 4 = 0.5904, draft i kept with probability 0.8^(i+1).
def test_simulated_decode_matches_formula():
    a, K = 0.8, 4
    sim = simulate_decode(a, K, steps=1000, seed=0)
    assert expected_tokens(a, K) == pytest.approx(3.3616, rel=1e-12)
    assert sim["tokens_per_step"] == pytest.approx(3.3616, rel=0.05)
    assert sim["tokens_per_step"] == pytest.approx(sim["mean_accepted"] + 1)
    assert sim["acceptance_rate"] == pytest.approx(0.5904, abs=0.03)
    assert sim["acceptance_rate"] == pytest.approx(sim["mean_accepted"] / K)
    per_pos = sim["per_position_acceptance"]
    assert per_pos.shape == (K,) and np.all(np.diff(per_pos) <= 0)
    np.testing.assert_allclose(per_pos, a ** np.arange(1, K + 1), atol=0.05)


def test_expected_tokens_limits_and_vectorised():
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1 - 1e-12, 5) == pytest.approx(6.0, rel=1e-9)
    got = expected_tokens(np.array([0.5, 0.8, 1.0]), np.array([[1], [5]]))      # [2, 3]
    np.testing.assert_allclose(got, [[1.5, 1.8, 2.0], [1.96875, 3.68928, 6.0]])
    assert walltime_improvement(1.0, 4, 0.25) == pytest.approx(5 / 2)
    with pytest.raises(ValueError):
        expected_tokens(1.2, 3)


def test_best_k():
    k, w = best_k(0.8, 0.05)
    assert 1 <= k <= 16
    assert w == pytest.approx(max(walltime_improvement(0.8, kk, 0.05) for kk in range(1, 17)))
    assert w == pytest.approx(walltime_improvement(0.8, k, 0.05))
    assert best_k(0.9, 0.05)[0] >= k                        # better drafter, longer drafts
    assert best_k(0.8, 0.2)[0] <= k                         # costlier drafter, shorter drafts
    assert best_k(0.99, 0.0, k_max=7)[0] == 7


def test_break_even_acceptance():
    previous = 0.0
    for c in [0.01, 0.05, 0.1, 0.3, 0.6, 0.9]:
        for K in [1, 3, 5, 8]:
            a = break_even_acceptance(K, c)
            assert 0 < a < 1
            assert walltime_improvement(a, K, c) == pytest.approx(1.0, abs=1e-6)
            assert walltime_improvement(a + 0.01 * (1 - a), K, c) > 1.0
            assert walltime_improvement(0.99 * a, K, c) < 1.0
        a5 = break_even_acceptance(5, c)
        assert a5 > previous                                # costlier drafts need more acceptance
        previous = a5
    assert break_even_acceptance(1, 0.3) == pytest.approx(0.3)     # K = 1: (1 + a) = (1 + c)
    assert break_even_acceptance(4, 0.0) == 0.0
    assert break_even_acceptance(4, 1.0) == 1.0
    assert break_even_acceptance(4, 2.5) == 1.0


def test_expected_tokens_traced_in_jit_equals_the_checked_numpy_form():
    import jax
    import jax.numpy as jnp
    a, K = np.array([0.0, 0.3, 0.8, 0.999, 1.0]), np.array([0, 1, 3, 5, 8])
    traced = jax.jit(expected_tokens)(jnp.asarray(a, jnp.float32)[:, None], jnp.asarray(K, jnp.float32)[None])
    np.testing.assert_allclose(np.asarray(traced), expected_tokens(a[:, None], K[None]), rtol=1e-5)
