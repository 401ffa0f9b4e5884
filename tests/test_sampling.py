"""Sampling filters against transformers' logits warpers (the reference we did not write), and ties."""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from transformers.generation import logits_process as warpers

from jaxspec.sampling import Sampling, probs_from_logits, row_params

ROWS = [Sampling(temperature=0.7), Sampling(temperature=1.0, top_k=50), Sampling(temperature=0.8, top_p=0.9),
        Sampling(temperature=1.3, min_p=0.1), Sampling(temperature=0.7, top_k=40, top_p=0.8, min_p=0.05),
        Sampling(temperature=1.0, top_k=1), Sampling(temperature=0.6, top_p=0.5), Sampling(temperature=2.0, top_p=0.97)]


def _transformers_probs(logits: np.ndarray, s: Sampling) -> np.ndarray:
    """softmax after transformers' warpers, in the order its generate applies them."""
    scores = torch.tensor(logits[None])
    chain = [warpers.TemperatureLogitsWarper(s.temperature)]
    chain += [warpers.TopKLogitsWarper(s.top_k)] if s.top_k else []
    chain += [warpers.TopPLogitsWarper(s.top_p)] if s.top_p < 1 else []
    chain += [warpers.MinPLogitsWarper(s.min_p)] if s.min_p else []
    for w in chain:
        scores = w(None, scores)
    return torch.softmax(scores, dim=-1)[0].numpy()


@pytest.mark.parametrize("V", [1000, 49152])
def test_filters_match_transformers_warpers(V):
    rng = np.random.default_rng(V)
    logits = (3 * rng.standard_normal((len(ROWS), V))).astype(np.float32)
    logits[2, ::7] = -np.inf                                     # masked entries (as a reduced vocabulary gives)
    ours = np.asarray(jax.jit(probs_from_logits)(logits, row_params(ROWS, len(ROWS))))
    for i, s in enumerate(ROWS):
        ref = _transformers_probs(logits[i], s)
        assert np.array_equal(ours[i] > 0, ref > 0), f"row {i} ({s}): kept sets differ"
        np.testing.assert_allclose(ours[i], ref, rtol=2e-5, atol=1e-7, err_msg=f"row {i} ({s})")


def test_filters_per_position_keep_their_row_settings():
    """[B, T, V] logits: every position of a row uses that row's filters; greedy rows stay one-hot."""
    rng = np.random.default_rng(0)
    logits = (2 * rng.standard_normal((3, 4, 500))).astype(np.float32)
    rows = [Sampling(temperature=0.9, top_p=0.6), Sampling(), Sampling(temperature=1.1, top_k=7)]
    probs = np.asarray(probs_from_logits(logits, row_params(rows, 3)))
    for t in range(4):
        np.testing.assert_allclose(probs[0, t], _transformers_probs(logits[0, t], rows[0]), atol=1e-6)
        np.testing.assert_array_equal(probs[1, t], np.eye(500)[np.argmax(logits[1, t])])
        assert (probs[2, t] > 0).sum() == 7


@pytest.mark.parametrize("setting, kept", [
    (Sampling(temperature=1.0, top_k=2), [1, 1, 1, 1, 0]),      # ties at the 2nd largest value all kept
    (Sampling(temperature=1.0, top_p=0.35), [1, 0, 0, 0, 0]),   # 0.4 above the tied group: not below 0.35
    (Sampling(temperature=1.0, top_p=0.45), [1, 1, 1, 1, 0]),   # 0.4 above it < 0.45: the whole group
    (Sampling(temperature=1.0, min_p=0.4), [1, 1, 1, 1, 0]),    # 0.18 >= 0.4 * 0.4 > 0.06
])
def test_ties_at_a_cutoff_are_kept_together(setting, kept):
    logits = np.log(np.array([[0.4, 0.18, 0.18, 0.18, 0.06]], np.float32))
    probs = np.asarray(probs_from_logits(logits, row_params(setting, 1)))[0]
    np.testing.assert_array_equal((probs > 0).astype(int), kept)
    np.testing.assert_allclose(probs.sum(), 1.0, atol=1e-6)


def test_draft_draws_take_the_argmax_for_greedy_rows_and_sample_the_rest():
    from jaxspec.drafters.base import draw_token

    draw = jax.jit(draw_token)
    logits = jax.random.normal(jax.random.PRNGKey(0), (3, 500)) * 3
    best = np.argmax(np.asarray(logits), -1)
    greedy = row_params(Sampling(), 3)
    tok, q = draw(logits, jax.random.PRNGKey(1), greedy)
    np.testing.assert_array_equal(tok, best)
    np.testing.assert_array_equal(q, probs_from_logits(logits, greedy))           # one-hot rows
    mixed = row_params([Sampling(), Sampling(temperature=1.0), Sampling()], 3)
    draws = np.stack([draw(logits, jax.random.PRNGKey(k), mixed)[0] for k in range(200)])
    assert (draws[:, [0, 2]] == best[[0, 2]]).all()
    assert len(set(draws[:, 1].tolist())) > 5                                      # row 1 is drawn
    np.testing.assert_allclose(draw(logits, jax.random.PRNGKey(1), mixed)[1][1],
                               probs_from_logits(logits, mixed)[1], rtol=1e-6)
