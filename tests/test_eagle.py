"""EAGLE head and drafter: feature/token alignment against a one-shot computation, losslessness,
save/load, and refusal of a head made for another target (tiny random models)."""
from __future__ import annotations

import lzma

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxspec
from jaxspec.cache import init_cache
from jaxspec.drafters import Eagle
from jaxspec.drafters.base import Context
from jaxspec.heads import EagleConfig, eagle_step, fuse_features, init_eagle_params
from jaxspec.heads.eagle import to_target_logits
from jaxspec.heads.metadata import HeadMetadata
from jaxspec.models import forward
from jaxspec.sampling import Sampling, row_params

from .conftest import TINY, tiny_model

LAYERS = (0, 1, 2)


def _eagle(seed=3, vd=48):
    cfg = EagleConfig.for_target(TINY, draft_vocab_size=vd, feature_layers=LAYERS)
    d2t = np.random.RandomState(seed).permutation(TINY.vocab_size)[:vd]
    return Eagle(init_eagle_params(cfg, jax.random.PRNGKey(seed), d2t=d2t, scale=0.3), cfg)


def _one_shot_q(m, e, seq):
    """Draft distribution for the token after seq[-1], from all pairs (feature_t, seq[t+1]) at once."""
    feats = forward(m.params, jnp.asarray([seq[:-1]]), init_cache(TINY, 1, 64), TINY, LAYERS)[1]
    head = e.head_params
    g = fuse_features(head, feats)
    _, logits, _ = eagle_step(head, m.params["embed"], g, jnp.asarray([seq[1:]]), init_cache(
        e.cfg.cache_config(), 1, 64), e.cfg)
    return jax.nn.softmax(to_target_logits(head, logits[:, -1], TINY.vocab_size), -1)[0]


def test_incremental_drafting_matches_one_shot_pairs():
    m, e = tiny_model(), _eagle()
    params = e.params_for(m)
    prompt = [5, 9, 2, 7, 7, 1]
    P, K = len(prompt), 2
    first, corr = 11, 23
    sampling = row_params(Sampling(temperature=1.0), 1)
    prompt_feats = forward(m.params, jnp.asarray([prompt]), init_cache(TINY, 1, 64), TINY, LAYERS)[1]
    state = e.init(params, jnp.asarray([prompt]), jnp.asarray([P]), 64, prompt_feats)
    history = jnp.zeros((1, 64), jnp.int32).at[0, :P + 1].set(jnp.asarray(prompt + [first]))
    feats = jnp.zeros((3, 1, K + 1, TINY.hidden_size)).at[:, :, 0].set(prompt_feats[:, :, P - 1])
    ctx = Context(jnp.asarray([first]), history, jnp.asarray([P + 1]), sampling, feats)
    _, q, state = e.propose(params, state, ctx, jax.random.PRNGKey(0), K)
    np.testing.assert_allclose(q[0, 0], _one_shot_q(m, e, prompt + [first]), atol=1e-5)

    # the target verifies [first, d1, d2] and rejects d1: the correction `corr` follows `first`
    cache = init_cache(TINY, 1, 64)
    cache = forward(m.params, jnp.asarray([prompt]), cache, TINY)[2]
    verify_feats = forward(m.params, jnp.asarray([[first, 3, 4]]), cache, TINY, LAYERS)[1]
    state = e.commit(params, state, ctx, jnp.asarray([0]))
    history = history.at[0, P + 1].set(corr)
    ctx = Context(jnp.asarray([corr]), history, jnp.asarray([P + 2]), sampling, verify_feats)
    _, q, _ = e.propose(params, state, ctx, jax.random.PRNGKey(1), K)
    np.testing.assert_allclose(q[0, 0], _one_shot_q(m, e, prompt + [first, corr]), atol=1e-5)


def test_drafting_after_plain_steps_matches_one_shot_pairs():
    """Plain steps (sync: features stored, no head pass) over more than CATCH_UP positions, then a
    propose that writes the skipped pairs in chunks: its draft equals the one-shot computation."""
    from jaxspec.drafters.base import CATCH_UP

    m, e = tiny_model(), _eagle()
    params = e.params_for(m)
    prompt, K, S = [5, 9, 2, 7, 7, 1], 2, 64
    seq = prompt + [int(t) for t in np.random.RandomState(0).randint(1, TINY.vocab_size, CATCH_UP + 5)]
    sampling = row_params(Sampling(temperature=1.0), 1)
    cache = forward(m.params, jnp.asarray([prompt]), init_cache(TINY, 1, S), TINY, LAYERS)
    prompt_feats, cache = cache[1], cache[2]
    state = e.init(params, jnp.asarray([prompt]), jnp.asarray([len(prompt)]), S, prompt_feats)
    history = jnp.zeros((1, S + K + 1), jnp.int32).at[0, :len(seq)].set(jnp.asarray(seq))
    feats = jnp.zeros((3, 1, K + 1, TINY.hidden_size)).at[:, :, 0].set(prompt_feats[:, :, -1])
    for t in range(len(prompt), len(seq) - 1):           # a plain step: the target takes seq[t]
        ctx = Context(jnp.asarray([seq[t]]), history, jnp.asarray([t + 1]), sampling, feats)
        state = e.commit(params, e.sync(params, state, ctx), ctx, jnp.asarray([0]))
        step_feats, cache = forward(m.params, jnp.asarray([[seq[t]]]), cache, TINY, LAYERS)[1:]
        feats = jnp.zeros_like(feats).at[:, :, :1].set(step_feats)
    ctx = Context(jnp.asarray([seq[-1]]), history, jnp.asarray([len(seq)]), sampling, feats)
    _, q, state = e.propose(params, state, ctx, jax.random.PRNGKey(0), K)
    np.testing.assert_allclose(q[0, 0], _one_shot_q(m, e, seq), atol=1e-5)
    assert int(state.written[0]) == len(seq) - 1                # every pair up to the target's length written


@pytest.mark.parametrize("K", [1, 3])
def test_eagle_greedy_lossless_with_per_position_statistics(K):
    m, e = tiny_model(), _eagle()
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6, 7, 8, 9, 10, 11, 12, 4, 5], [7]]
    plain = jaxspec.generate(m, prompts, max_new_tokens=20).tokens
    out = jaxspec.generate(m, prompts, max_new_tokens=20, drafter=e, num_draft_tokens=K, adaptive=False)
    assert out.tokens == plain
    assert len(out.stats.per_position_acceptance) == K


def test_save_load_round_trip_and_target_guard(tmp_path):
    m, e = tiny_model(), _eagle()
    e.metadata = HeadMetadata(target="tiny", target_fingerprint=m.fingerprint, hidden_layers=e.hidden_layers,
                              draft_vocab_size=e.cfg.draft_vocab_size)
    e.save(str(tmp_path / "head"))
    back = Eagle.load(str(tmp_path / "head"))
    assert back.cfg == e.cfg and back.metadata == e.metadata
    as_stored = lambda v: v.astype(jnp.bfloat16).astype(jnp.float32) if v.dtype != jnp.int32 else v   # bfloat16
    chex.assert_trees_all_close(back.head_params, jax.tree_util.tree_map(as_stored, e.head_params))
    back.check_target(m)
    params = tmp_path / "head" / "params.safetensors"                 # shipped heads are kept xz-compressed
    (tmp_path / "head" / "params.safetensors.xz").write_bytes(lzma.compress(params.read_bytes()))
    params.unlink()
    chex.assert_trees_all_equal(Eagle.load(str(tmp_path / "head")).head_params, back.head_params)
    other = tiny_model(seed=5)
    with pytest.raises(ValueError, match="trained for target 'tiny'"):
        jaxspec.generate(other, [[1, 2]], max_new_tokens=4, drafter=back)
    params.write_bytes(b"\x00" * 20)                                    # the plain file is read first
    with pytest.raises(ValueError, match="corrupt or truncated"):
        Eagle.load(str(tmp_path / "head"))
    with pytest.raises(ValueError, match="eagle head not found"):
        Eagle.load(str(tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="needs head.json"):
        Eagle.load(str(tmp_path / "empty"))


def test_head_metadata_rejects_unknown_keys_and_a_head_it_does_not_describe():
    e = _eagle()
    with pytest.raises(ValueError, match="unknown head metadata keys"):
        Eagle(e.head_params, e.cfg, {"target": "tiny", "heldout": 0.3})
    with pytest.raises(ValueError, match="hidden_layers"):
        Eagle(e.head_params, e.cfg, {"hidden_layers": [0]})
    with pytest.raises(ValueError, match="draft_vocab_size"):
        Eagle(e.head_params, e.cfg, {"draft_vocab_size": e.cfg.draft_vocab_size + 1})
    shipped = Eagle(e.head_params, e.cfg, {"heldout_acceptance": {"per_position_acceptance": [0.4, 0.1]}})
    assert shipped.metadata.hidden_layers == e.hidden_layers and shipped.prior_acceptance == (0.4,)


def test_tied_head_drafts_through_the_target_rows_and_stores_none(tmp_path):
    m = tiny_model()
    cfg = EagleConfig.for_target(TINY, draft_vocab_size=48, feature_layers=LAYERS, tied_head=True)
    d2t = np.random.RandomState(2).permutation(TINY.vocab_size)[:48]
    e = Eagle(init_eagle_params(cfg, jax.random.PRNGKey(2), d2t=d2t, scale=0.3), cfg)
    assert "lm_head" not in e.head_params
    rows = e.params_for(m)["rows"]
    np.testing.assert_array_equal(rows, m.params["embed"][d2t].T if "lm_head" not in m.params
                                  else m.params["lm_head"][:, d2t])
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [7]]
    out = jaxspec.generate(m, prompts, max_new_tokens=16, drafter=e, num_draft_tokens=3, adaptive=False)
    assert out.tokens == jaxspec.generate(m, prompts, max_new_tokens=16).tokens
    e.save(str(tmp_path / "tied"))
    back = Eagle.load(str(tmp_path / "tied"))
    assert back.cfg.tied_head and "lm_head" not in back.head_params
