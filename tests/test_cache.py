"""Static KV cache: multi-token writes, masked rollback, independent rows (tiny random model)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.cache import init_cache, rollback
from jaxspec.models import forward as _forward

from .conftest import TINY, tiny_model

CFG = TINY
forward = jax.jit(_forward, static_argnums=(3, 4))


def _ids(seed, shape):
    return jax.random.randint(jax.random.PRNGKey(seed), shape, 0, CFG.vocab_size, dtype=jnp.int32)


def test_multi_token_forward_equals_single_steps():
    m = tiny_model()
    prefix, block = _ids(1, (2, 5)), _ids(2, (2, 4))
    cache = forward(m.params, prefix, init_cache(CFG, 2, 32), CFG)[2]
    multi, _, cache_multi = forward(m.params, block, cache, CFG)
    cache = forward(m.params, prefix, init_cache(CFG, 2, 32), CFG)[2]
    singles = []
    for t in range(4):
        logits, _, cache = forward(m.params, block[:, t:t + 1], cache, CFG)
        singles.append(logits)
    np.testing.assert_allclose(np.concatenate(singles, 1), multi, atol=1e-5)
    np.testing.assert_array_equal(cache.length, [9, 9])
    np.testing.assert_array_equal(cache_multi.length, cache.length)
    np.testing.assert_allclose(cache_multi.k[:, :, :9], cache.k[:, :, :9], atol=1e-5)
    np.testing.assert_allclose(cache_multi.v[:, :, :9], cache.v[:, :, :9], atol=1e-5)


def test_rollback_then_rewrite_equals_never_written():
    m = tiny_model()
    prefix, junk, real = _ids(3, (2, 6)), _ids(4, (2, 5)), _ids(5, (2, 3))
    clean = forward(m.params, prefix, init_cache(CFG, 2, 32), CFG)[2]
    expected = forward(m.params, real, clean, CFG)[0]
    dirty = forward(m.params, junk, clean, CFG)[2]         # 5 rejected tokens written...
    dirty = rollback(dirty, jnp.array([6, 6]))             # ...then only the length goes back
    assert float(jnp.abs(dirty.k[:, :, 6:11]).sum()) > 0   # the stale slots are still there
    got = forward(m.params, real, dirty, CFG)[0]
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_rows_of_different_lengths_do_not_disturb_each_other():
    m = tiny_model()
    a, b = _ids(6, (1, 7)), _ids(7, (1, 3))
    alone_a = forward(m.params, a, init_cache(CFG, 1, 32), CFG)[0][0, -1]
    alone_b = forward(m.params, b, init_cache(CFG, 1, 32), CFG)[0][0, -1]
    # batch them right-padded with garbage, roll each row back to its own length, step once more
    padded = jnp.concatenate([a, jnp.concatenate([b, _ids(8, (1, 4))], 1)], 0)
    cache = rollback(forward(m.params, padded, init_cache(CFG, 2, 32), CFG)[2], jnp.array([7, 3]))
    nxt = _ids(9, (2, 1))
    batched = forward(m.params, nxt, cache, CFG)[0][:, 0]
    ref_a = forward(m.params, nxt[:1], forward(m.params, a, init_cache(CFG, 1, 32), CFG)[2], CFG)[0][0, 0]
    ref_b = forward(m.params, nxt[1:], forward(m.params, b, init_cache(CFG, 1, 32), CFG)[2], CFG)[0][0, 0]
    np.testing.assert_allclose(batched[0], ref_a, atol=1e-5)
    np.testing.assert_allclose(batched[1], ref_b, atol=1e-5)
    assert not np.allclose(alone_a, alone_b)  # the rows really are different


def test_hidden_states_of_requested_layers():
    m = tiny_model()
    ids = _ids(10, (2, 4))
    logits, hidden, _ = forward(m.params, ids, init_cache(CFG, 2, 8), CFG, hidden_layers=(0, 1, 2))
    assert hidden.shape == (3, 2, 4, CFG.hidden_size)
    np.testing.assert_allclose(hidden[0], m.params["embed"][ids])
    assert not np.allclose(hidden[1], hidden[2])


def test_per_layer_and_stacked_layouts_agree():
    """Loaded models keep layers as a tuple (run unrolled), init_params stacks them (run by scan):
    logits, requested hidden states and the written cache agree between the two layouts."""
    from jaxspec.models import stack_layers, unstack_layers

    m = tiny_model()
    per_layer = {**m.params, "layers": unstack_layers(m.params["layers"])}
    assert isinstance(m.params["layers"], dict) and len(per_layer["layers"]) == CFG.num_layers
    ids = _ids(11, (2, 5))
    a = forward(m.params, ids, init_cache(CFG, 2, 8), CFG, (0, 2, 1))
    b = forward(per_layer, ids, init_cache(CFG, 2, 8), CFG, (0, 2, 1))
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(x, y, atol=1e-6)
    back = stack_layers(per_layer["layers"])
    assert all(np.array_equal(back[k], m.params["layers"][k]) for k in back)


def test_live_attention_equals_attention_over_every_slot():
    """attend_live reads only the first `live` slots in blocks with a running softmax; the rows it
    serves get what attention over all S slots gives (the last block shifted back to fit in S)."""
    from jaxspec.cache import attention_mask
    from jaxspec.models.llama import attend, attend_live, window_mask
    for B, T, S, block in [(3, 1, 20, 8), (2, 4, 37, 16), (4, 2, 64, 128), (2, 1, 10, 4)]:
        q, k, v = (jax.random.normal(jax.random.PRNGKey(i), shape) for i, shape in
                   enumerate([(B, T, 4, 8), (B, S, 2, 8), (B, S, 2, 8)]))
        length = jax.random.randint(jax.random.PRNGKey(B * S), (B,), 0, S - T + 1)
        pos = length[:, None] + jnp.arange(T)[None]
        full = attend(q, k, v, attention_mask(pos, S))
        np.testing.assert_allclose(attend_live(q, k, v, pos, jnp.max(length) + T, block), full, atol=1e-5)
        for window in (3, 9):              # sliding window: blocks older than every query's window skipped
            windowed = attend(q, k, v, attention_mask(pos, S) & window_mask(pos, S, window))
            np.testing.assert_allclose(attend_live(q, k, v, pos, jnp.max(length) + T, block, window), windowed,
                                       atol=1e-5)
    # through the model: a 300-slot cache (5 blocks of 64, the last shifted), rows of different lengths
    m = tiny_model()
    cache = forward(m.params, _ids(10, (2, 150)), init_cache(CFG, 2, 300), CFG)[2]
    cache = rollback(cache, jnp.array([150, 61]))
    for T in (1, 3):
        nxt = _ids(11, (2, T))
        ref = forward(m.params, nxt, cache, CFG)[0]
        live = _forward(m.params, nxt, cache, CFG, (), jnp.int32(150 + T))[0]
        np.testing.assert_allclose(live, ref, atol=1e-5)
