"""rejection_sample: the emitted tokens follow the target distribution exactly; greedy is argmax matching."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxspec.rejection import rejection_sample

N = 200_000  # samples per check; the TVD sampling noise is ~0.5 * sqrt(2 V / (pi N)) <= 0.005 for V <= 32
TVD_MAX, PVALUE_MIN = 0.01, 1e-3


def _dist(key, shape, V, sharpness=1.5):
    return jax.nn.softmax(sharpness * jax.random.normal(key, shape + (V,)), axis=-1)


def _check(samples, p, what):
    V = p.shape[-1]
    counts = np.bincount(np.asarray(samples), minlength=V)
    freq = counts / counts.sum()
    p = np.asarray(p, np.float64)
    assert 0.5 * np.abs(freq - p).sum() <= TVD_MAX, f"{what}: TVD {0.5 * np.abs(freq - p).sum():.4f}"
    keep = p * counts.sum() >= 5                       # chi-square needs expected counts >= 5
    expected = p[keep] * counts.sum()
    observed = counts[keep].astype(np.float64)
    expected *= observed.sum() / expected.sum()
    assert stats.chisquare(observed, expected).pvalue > PVALUE_MIN, what
    assert counts[~keep].sum() <= max(10, 0.001 * counts.sum()), f"{what}: mass where p ~ 0"


def _setup(seed, K, V, draft_probs: bool, first_mass: float = 0.0):
    """Rows share a target p [K+1, V] and a draft q [K, V] that differs from it.

    first_mass > 0 puts that much of both p[0] and q[0] on token 0 (the deterministic drafter then
    proposes 0 first), so the first draft is often accepted and the conditional check has data.
    """
    kp, kq, kx, kr = jax.random.split(jax.random.PRNGKey(seed), 4)
    p = _dist(kp, (K + 1,), V)                  # target, same for every row
    q = _dist(kq, (K,), V)                      # a differently shaped draft
    if first_mass:
        spike = first_mass * jax.nn.one_hot(0, V)
        p = p.at[0].set(spike + (1 - first_mass) * p[0])
        q = q.at[0].set(spike + (1 - first_mass) * q[0])
    P = jnp.broadcast_to(p, (N, K + 1, V))
    if draft_probs:
        Q = jnp.broadcast_to(q, (N, K, V))
        x = jax.random.categorical(kx, jnp.log(Q), axis=-1).astype(jnp.int32)
    else:                                       # deterministic drafter: always proposes argmax q
        Q = None
        x = jnp.broadcast_to(jnp.argmax(q, -1).astype(jnp.int32), (N, K))
    n, out = jax.jit(rejection_sample)(x, Q, P, kr)
    return p, q, x, np.asarray(n), np.asarray(out)


@pytest.mark.parametrize("seed, K, V", [(0, 1, 10), (1, 2, 20), (2, 3, 32)])
@pytest.mark.parametrize("draft_probs", [True, False])
def test_first_token_follows_target(seed, K, V, draft_probs):
    p, q, x, n, out = _setup(seed, K, V, draft_probs)
    assert 0.5 * float(jnp.abs(p[0] - q[0]).sum()) > 0.2, "draft must differ from target for the test to bite"
    _check(out[:, 0], p[0], "first token")
    assert ((out >= 0).sum(1) == n + 1).all() and (out[np.arange(N), n] >= 0).all()
    if draft_probs:                             # acceptance rate of position 1 is sum_x min(p, q)
        expected = float(jnp.minimum(p[0], q[0]).sum())
        assert abs((n >= 1).mean() - expected) < 0.01


@pytest.mark.parametrize("seed, K, V", [(3, 2, 16), (4, 3, 32)])
@pytest.mark.parametrize("draft_probs", [True, False])
def test_second_token_given_first_accepted_follows_target(seed, K, V, draft_probs):
    p, q, x, n, out = _setup(seed, K, V, draft_probs, first_mass=0.6)
    assert 0.5 * float(jnp.abs(p[1] - q[1]).sum()) > 0.2
    assert (n >= 1).sum() > 0.55 * N
    _check(out[n >= 1, 1], p[1], "second token | first accepted")


def test_identical_draft_and_target_never_reject_and_no_nan():
    V, K = 16, 3
    p = _dist(jax.random.PRNGKey(5), (K + 1,), V)
    P = jnp.broadcast_to(p, (4096, K + 1, V))
    x = jax.random.categorical(jax.random.PRNGKey(6), jnp.log(P[:, :K]), axis=-1).astype(jnp.int32)
    n, out = rejection_sample(x, P[:, :K], P, jax.random.PRNGKey(7))
    assert (np.asarray(n) == K).all()
    np.testing.assert_array_equal(np.asarray(out)[:, :K], np.asarray(x))
    assert (np.asarray(out)[:, K] >= 0).all()


def _onehot(ids, V=8):
    return jax.nn.one_hot(jnp.asarray(ids), V)


def test_greedy_exact_cases():
    # rows: perfect match + bonus, mismatch at position 2, mismatch at position 1, another full match
    target_argmax = [[3, 4, 5, 6], [3, 4, 5, 6], [1, 2, 3, 4], [7, 7, 7, 0]]
    drafts = jnp.array([[3, 4, 5], [3, 0, 5], [2, 2, 3], [7, 7, 7]], jnp.int32)
    for probs in (None, _onehot(drafts)):
        n, out = rejection_sample(drafts, probs, _onehot(target_argmax), jax.random.PRNGKey(0))
        np.testing.assert_array_equal(n, [3, 1, 0, 3])
        np.testing.assert_array_equal(out, [[3, 4, 5, 6], [3, 4, -1, -1], [1, -1, -1, -1], [7, 7, 7, 0]])


def test_all_rejected_at_first_position_emits_target_argmax():
    drafts = jnp.array([[1, 1, 1, 1, 1]] * 3, jnp.int32)
    target = _onehot([[2, 1, 1, 1, 1, 1], [5, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]])
    n, out = rejection_sample(drafts, None, target, jax.random.PRNGKey(1))
    np.testing.assert_array_equal(n, [0, 0, 0])
    np.testing.assert_array_equal(out[:, 0], [2, 5, 0])
    assert (np.asarray(out)[:, 1:] == -1).all()


def test_shape_errors():
    with pytest.raises(ValueError, match="target_probs"):
        rejection_sample(jnp.zeros((2, 3), jnp.int32), None, jnp.ones((2, 3, 8)) / 8, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match="draft_probs"):
        rejection_sample(jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 2, 8)) / 8, jnp.ones((2, 4, 8)) / 8,
                         jax.random.PRNGKey(0))
