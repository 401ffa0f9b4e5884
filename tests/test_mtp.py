"""MTP heads and drafter: drafts against a one-shot teacher-forced pass (also after a rejection),
losslessness for K below, at and above the number of modules, save/load and the target guard
(tiny random models)."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.cache import init_cache
from jaxspec.drafters import MTP
from jaxspec.drafters.base import Context
from jaxspec.heads import MTPConfig, init_mtp_params, mtp_logits, mtp_window
from jaxspec.heads.eagle import to_target_logits
from jaxspec.heads.metadata import HeadMetadata
from jaxspec.models import forward, lm_head_rows
from jaxspec.sampling import Sampling, row_params

from .conftest import TINY, tiny_model

L = TINY.num_layers


def _mtp(seed=3, vd=64, modules=2):
    cfg = MTPConfig.for_target(TINY, num_modules=modules, draft_vocab_size=vd)
    d2t = np.random.RandomState(seed).permutation(TINY.vocab_size)[:vd]
    return MTP(init_mtp_params(cfg, jax.random.PRNGKey(seed), d2t=d2t, scale=0.3), cfg)


def _one_shot_q(m, d, history, drafts, j):
    """Module j's (1-based) distribution for token len(history) + j - 1, teacher-forced on
    history + drafts: every module over all positions 0..n-2 at once, from fresh caches."""
    n = len(history)
    h0 = forward(m.params, jnp.asarray([history[:-1]]), init_cache(TINY, 1, 64), TINY, (L,))[1][0]
    full = history + list(drafts) + [0] * d.cfg.num_modules
    nxt = jnp.asarray([full[1:n - 1 + d.cfg.num_modules]])
    hs, _ = mtp_window(d.head_params, m.params["embed"], h0, nxt, init_cache(d.cfg.cache_config(), 1, 64),
                       d.cfg, jnp.zeros((1,), jnp.int32))
    logits = mtp_logits(m.params["norm"], lm_head_rows(m.params, d.head_params["d2t"]), hs[j - 1, 0, n - 2],
                        TINY.rms_norm_eps)
    return jax.nn.softmax(to_target_logits(d.head_params, logits, TINY.vocab_size))


def test_drafts_match_one_shot_modules_also_after_a_rejection():
    m, d = tiny_model(), _mtp()
    params = d.params_for(m)
    prompt = [5, 9, 2, 7, 7, 1, 3, 8, 8, 4, 6]
    P, K = len(prompt), 2
    first, corr = 11, 23
    sampling = row_params(Sampling(temperature=1.0), 1)
    prompt_feats = forward(m.params, jnp.asarray([prompt]), init_cache(TINY, 1, 64), TINY, (L,))[1]
    state = d.init(params, jnp.asarray([prompt]), jnp.asarray([P]), 64, prompt_feats)
    history = jnp.zeros((1, 64), jnp.int32).at[0, :P + 1].set(jnp.asarray(prompt + [first]))
    feats = jnp.zeros((1, 1, K + 1, TINY.hidden_size)).at[:, :, 0].set(prompt_feats[:, :, P - 1])
    ctx = Context(jnp.asarray([first]), history, jnp.asarray([P + 1]), sampling, feats)
    drafts, q, state = d.propose(params, state, ctx, jax.random.PRNGKey(0), K)
    hist = prompt + [first]
    for j in (1, 2):
        np.testing.assert_allclose(q[0, j - 1], _one_shot_q(m, d, hist, drafts[0, :j - 1].tolist(), j), atol=1e-5)

    # the target verifies [first, d1, d2], accepts d1 and replaces d2 by `corr`: the modules' entries
    # that were computed from d2 must be recomputed
    cache = forward(m.params, jnp.asarray([prompt]), init_cache(TINY, 1, 64), TINY)[2]
    d1 = int(drafts[0, 0])
    verify_feats = forward(m.params, jnp.asarray([[first, d1, 4]]), cache, TINY, (L,))[1]
    state = d.commit(params, state, ctx, jnp.asarray([1]))
    history = history.at[0, P + 1].set(d1).at[0, P + 2].set(corr)
    ctx = Context(jnp.asarray([corr]), history, jnp.asarray([P + 3]), sampling, verify_feats)
    drafts, q, _ = d.propose(params, state, ctx, jax.random.PRNGKey(1), K)
    hist = prompt + [first, d1, corr]
    for j in (1, 2):
        np.testing.assert_allclose(q[0, j - 1], _one_shot_q(m, d, hist, drafts[0, :j - 1].tolist(), j), atol=1e-5)


def _start(m, d, prompt, first, K, S=64):
    """Drafter state after the prompt, and the first step's context (the prompt's last h^0 at index 0)."""
    params, P = d.params_for(m), len(prompt)
    prompt_feats = forward(m.params, jnp.asarray([prompt]), init_cache(TINY, 1, S), TINY, (L,))[1]
    state = d.init(params, jnp.asarray([prompt]), jnp.asarray([P]), S, prompt_feats)
    history = jnp.zeros((1, S + K + 1), jnp.int32).at[0, :P + 1].set(jnp.asarray(prompt + [first]))
    feats = jnp.zeros((1, 1, K + 1, TINY.hidden_size)).at[:, :, 0].set(prompt_feats[:, :, P - 1])
    return params, state, Context(jnp.asarray([first]), history, jnp.asarray([P + 1]),
                                  row_params(Sampling(temperature=1.0), 1), feats)


def test_drafts_after_plain_steps_match_one_shot_modules():
    """Plain steps (sync: h^0 stored, no module pass) over more than CATCH_UP positions, then a
    propose that runs the modules over the skipped positions in chunks: drafts as the one-shot pass."""
    from jaxspec.drafters.base import CATCH_UP

    m, d = tiny_model(), _mtp()
    prompt, K = [5, 9, 2, 7, 7, 1], 2
    seq = prompt + [int(t) for t in np.random.RandomState(0).randint(1, TINY.vocab_size, CATCH_UP + 6)]
    params, state, ctx = _start(m, d, prompt, seq[len(prompt)], K)
    cache = forward(m.params, jnp.asarray([prompt]), init_cache(TINY, 1, 64), TINY)[2]
    history = ctx.history.at[0, :len(seq)].set(jnp.asarray(seq))
    for t in range(len(prompt), len(seq) - 1):           # a plain step: the target takes seq[t]
        ctx = ctx._replace(last=jnp.asarray([seq[t]]), history=history, history_len=jnp.asarray([t + 1]))
        state = d.commit(params, d.sync(params, state, ctx), ctx, jnp.asarray([0]))
        step_feats, cache = forward(m.params, jnp.asarray([[seq[t]]]), cache, TINY, (L,))[1:]
        ctx = ctx._replace(features=jnp.zeros_like(ctx.features).at[:, :, :1].set(step_feats))
    assert int(state.written[0]) == len(prompt) - d.cfg.num_modules      # plain steps ran no module
    ctx = ctx._replace(last=jnp.asarray([seq[-1]]), history=history, history_len=jnp.asarray([len(seq)]))
    drafts, q, state = d.propose(params, state, ctx, jax.random.PRNGKey(0), K)
    for j in (1, 2):
        np.testing.assert_allclose(q[0, j - 1], _one_shot_q(m, d, seq, drafts[0, :j - 1].tolist(), j), atol=1e-5)


def test_a_smaller_K_after_a_long_accepted_run_matches_one_shot_modules():
    """K = 5 with every draft kept moves 6 positions; the next step's K = 1 window covers only the
    last 2: the positions in between are taken in before it (they were never run with final tokens)."""
    m, d = tiny_model(), _mtp()
    prompt, first, bonus, K = [5, 9, 2, 7, 7, 1, 3, 8], 11, 23, 5
    params, state, ctx = _start(m, d, prompt, first, K)
    drafts, _, state = d.propose(params, state, ctx, jax.random.PRNGKey(0), K)
    drafts = drafts[0].tolist()
    cache = forward(m.params, jnp.asarray([prompt]), init_cache(TINY, 1, 64), TINY)[2]
    verify_feats = forward(m.params, jnp.asarray([[first] + drafts]), cache, TINY, (L,))[1]
    state = d.commit(params, state, ctx, jnp.asarray([K]))                 # all kept, then the bonus token
    hist = prompt + [first] + drafts + [bonus]
    ctx = ctx._replace(last=jnp.asarray([bonus]), history=ctx.history.at[0, :len(hist)].set(jnp.asarray(hist)),
                       history_len=jnp.asarray([len(hist)]), features=verify_feats)
    _, q, _ = d.propose(params, state, ctx, jax.random.PRNGKey(1), 1)
    np.testing.assert_allclose(q[0, 0], _one_shot_q(m, d, hist, [], 1), atol=1e-5)


@pytest.mark.parametrize("K", [1, 2, 5])
def test_mtp_greedy_lossless(K):
    m, d = tiny_model(), _mtp()
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6, 7, 8, 9, 10, 11, 12, 4, 5], [7]]
    plain = jaxspec.generate(m, prompts, max_new_tokens=20).tokens
    out = jaxspec.generate(m, prompts, max_new_tokens=20, drafter=d, num_draft_tokens=K, adaptive=False)
    assert out.tokens == plain
    assert len(out.stats.per_position_acceptance) == K


def test_save_load_round_trip_and_target_guard(tmp_path):
    m, d = tiny_model(), _mtp()
    d.metadata = HeadMetadata(target="tiny", target_fingerprint=m.fingerprint, hidden_layers=d.hidden_layers,
                              draft_vocab_size=d.cfg.draft_vocab_size)
    d.save(str(tmp_path / "mtp"))
    back = MTP.load(str(tmp_path / "mtp"))
    assert back.cfg == d.cfg and back.metadata == d.metadata
    as_stored = lambda v: v.astype(jnp.bfloat16).astype(jnp.float32) if v.dtype != jnp.int32 else v   # bfloat16
    chex.assert_trees_all_close(back.head_params, jax.tree_util.tree_map(as_stored, d.head_params))
    back.check_target(m)
    with pytest.raises(ValueError, match="trained for target 'tiny'"):
        jaxspec.generate(tiny_model(seed=5), [[1, 2]], max_new_tokens=4, drafter=back)
    with pytest.raises(ValueError, match="holds a 'mtp' head, not 'eagle'"):
        jaxspec.drafters.Eagle.load(str(tmp_path / "mtp"))
    with pytest.raises(ValueError, match="num_modules"):
        MTPConfig.for_target(TINY, num_modules=0, draft_vocab_size=8)
