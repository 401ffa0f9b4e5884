"""EAGLE training-time test: the unrolled training forward computes exactly what drafting computes."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.cache import init_cache
from jaxspec.heads import DraftVocab, EagleConfig, EagleHead, eagle_step, fuse_features, init_eagle_params
from jaxspec.models import forward
from jaxspec.train.eagle import ttt_logits, ttt_loss

from .conftest import TINY, tiny_model

LAYERS = (0, 1, 2)


def _setup(T=12):
    m = tiny_model()
    cfg = EagleConfig.for_target(TINY, draft_vocab_size=40, feature_layers=LAYERS)
    head = init_eagle_params(cfg, jax.random.PRNGKey(4), scale=0.3)
    tokens = jax.random.randint(jax.random.PRNGKey(5), (1, T), 0, TINY.vocab_size, dtype=jnp.int32)
    feats = forward(m.params, tokens, init_cache(TINY, 1, T), TINY, LAYERS)[1]
    return m, cfg, head, tokens, feats


def test_unrolled_steps_equal_incremental_drafting():
    m, cfg, head, tokens, feats = _setup()
    embed = m.params["embed"]
    ttt = ttt_logits(EagleHead(cfg, head), embed, feats, tokens, 3, head["lm_head"])   # [3, 1, T, Vd]
    for p in (0, 4, 8):
        # the cache holds the real pairs (feature_t, token_{t+1}) for t <= p
        cache = init_cache(cfg.cache_config(), 1, 32)
        h, logits, cache = eagle_step(head, embed, fuse_features(head, feats[:, :, :p + 1]),
                                      tokens[:, 1:p + 2], cache, cfg)
        np.testing.assert_allclose(logits[0, p], ttt[0, 0, p], atol=1e-4)
        h = h[:, p:p + 1]
        for j in (1, 2):                                   # draft steps 2 and 3, teacher-forced tokens
            h, logits, cache = eagle_step(head, embed, h, tokens[:, p + j + 1:p + j + 2], cache, cfg)
            np.testing.assert_allclose(logits[0, 0], ttt[j, 0, p + j], atol=1e-4)


def test_loss_and_gradients():
    m, cfg, head, tokens, feats = _setup()
    target_logits = jax.random.normal(jax.random.PRNGKey(6), tokens.shape + (40,))
    mask = jnp.arange(12)[None] < 10
    module = EagleHead(cfg, head)
    loss, metrics = ttt_loss(module, m.params["embed"], feats, tokens, target_logits, mask, 3,
                             module.output_rows(m.params))
    assert np.isfinite(float(loss)) and metrics["loss_j"].shape == (3,)
    graph, trainable, vocab = nnx.split(module, nnx.Param, DraftVocab)     # d2t is a fixed id map, not trained
    def loss_of(p):
        head = nnx.merge(graph, p, vocab)
        return ttt_loss(head, m.params["embed"], feats, tokens, target_logits, mask, 3, head.output_rows(None))[0]
    grads = nnx.to_pure_dict(jax.grad(loss_of)(trainable))
    assert set(grads) == set(head) - {"d2t"}
    assert all(np.isfinite(np.asarray(g)).all() for g in grads.values())
    assert float(jnp.abs(grads["wq"]).sum()) > 0 and float(jnp.abs(grads["fc"]).sum()) > 0


def test_chunked_soft_ce_is_the_plain_soft_cross_entropy():
    """losses.chunked_soft_ce (chunks of positions, logits recomputed in the backward) against the
    whole-array formula: the same loss, per-step losses, agreement and gradients."""
    from jaxspec.train.losses import chunked_soft_ce, stepwise_soft_ce

    J, P, E, V = 3, 37, 8, 11
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    h, x = jax.random.normal(k[0], (J, P, E)), jax.random.normal(k[1], (P, E))
    rows, trows = jax.random.normal(k[2], (E, V)), jax.random.normal(k[3], (E, V))
    valid = jax.random.uniform(jax.random.PRNGKey(5), (J, P)) < 0.7

    def chunked(h):
        return chunked_soft_ce(lambda a: a @ rows, lambda a: a @ trows, h, x, valid, chunk=8)

    def whole(h):
        return stepwise_soft_ce((h @ rows)[:, None], (x @ trows)[None], [0] * J, [v[None] for v in valid])

    (a, ma), (b, mb) = chunked(h), whole(h)
    np.testing.assert_allclose(a, b, rtol=1e-5)
    np.testing.assert_allclose(ma["loss_j"], mb["loss_j"], rtol=1e-5)
    np.testing.assert_allclose(ma["top1_j"], mb["top1_j"], rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda h: chunked(h)[0])(h), jax.grad(lambda h: whole(h)[0])(h),
                               rtol=1e-4, atol=1e-6)


def test_flop_counts_see_every_chunk_of_a_loss():
    """XLA's cost analysis counts a loop body once; inside jaxspec.flops.counting() the loss's scan over
    chunks is unrolled, so 2 x J x P x E x V for the draft logits' forward is counted whatever the chunk."""
    from jaxspec.flops import counting
    from jaxspec.train.losses import chunked_soft_ce
    from jaxspec.train.profile import _flops

    J, P, E, V = 2, 512, 64, 256
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    h, x = jax.random.normal(k[0], (J, P, E)), jax.random.normal(k[1], (P, E))
    rows, trows = jax.random.normal(k[2], (E, V)), jax.random.normal(k[3], (E, V))
    valid = jnp.ones((J, P), bool)

    def gflop(chunk: int) -> float:
        loss = lambda h: chunked_soft_ce(lambda a: a @ rows, lambda a: a @ trows, h, x, valid, chunk=chunk)[0]
        with counting():
            return _flops(jax.jit(loss).lower(h).compile())

    draft_logits = 2 * J * P * E * V
    assert gflop(P) >= draft_logits
    assert abs(gflop(64) - gflop(P)) <= 0.05 * gflop(P)
