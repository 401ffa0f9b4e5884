"""EAGLE head training: the training-time test (EAGLE-3, Li et al. 2025) and its loss.

Step 1 reads the pairs (fused target feature_t, token_{t+1}) at every position. Step j > 1 reads
(h^{j-1}_{t-1}, token_{t+1}): the head's own output one position back, as when drafting the j-th
token. Its query at t sees what the cache would hold then: step-1 keys at s <= t-j+1 and the key
of step i at s = t-j+i for i = 2..j (a diagonal per step). Position t of step j predicts
token_{t+2}; its soft target is the target's distribution at t+1, restricted to the draft vocabulary.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxspec.heads.eagle import EagleConfig, eagle_out, eagle_qkv, fuse_features


def _shift(x: jax.Array, by: int) -> jax.Array:
    """x [B, T, ...] moved `by` positions later along T (the first `by` positions zero)."""
    if by == 0:
        return x
    return jnp.concatenate([jnp.zeros_like(x[:, :by]), x[:, :-by]], axis=1)


def ttt_logits(params, embed: jax.Array, feats: jax.Array, tokens: jax.Array, cfg: EagleConfig,
               steps: int) -> jax.Array:
    """feats [N, B, T, E] target features, tokens int32[B, T] -> draft logits [J, B, T, Vd]."""
    B, T = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    nxt = jnp.concatenate([tokens[:, 1:], jnp.zeros((B, 1), tokens.dtype)], axis=1)   # token_{t+1}
    feature = fuse_features(params, feats)
    t_idx = jnp.arange(T)
    keys, values, all_logits = [], [], []
    for j in range(1, steps + 1):
        q, k, v = eagle_qkv(params, embed, feature, nxt, pos, cfg)
        keys.append(k), values.append(v)
        H, G, D = q.shape[2], k.shape[2], q.shape[3]
        qg = q.reshape(B, T, G, H // G, D)
        block = jnp.einsum("btgrd,bsgd->bgrts", qg, keys[0], preferred_element_type=jnp.float32)
        block = jnp.where(t_idx[None, :] <= t_idx[:, None] - (j - 1), block, jnp.finfo(jnp.float32).min)
        diag = [jnp.einsum("btgrd,btgd->bgrt", qg, _shift(keys[i - 1], j - i),
                           preferred_element_type=jnp.float32)[..., None] for i in range(2, j + 1)]
        w = jax.nn.softmax(jnp.concatenate([block] + diag, axis=-1) / jnp.sqrt(D), axis=-1)
        out = jnp.einsum("bgrts,bsgd->btgrd", w[..., :T], values[0])
        for n, i in enumerate(range(2, j + 1)):
            out = out + w[..., T + n].transpose(0, 3, 1, 2)[..., None] * _shift(values[i - 1], j - i)[:, :, :, None]
        h, logits = eagle_out(params, feature, out.reshape(B, T, H, D).astype(feature.dtype), cfg)
        all_logits.append(logits)
        feature = _shift(h, 1)                                  # step j+1 at t reads h^j_{t-1}
    return jnp.stack(all_logits)


def ttt_loss(params, embed, feats, tokens, target_logits, loss_mask, cfg: EagleConfig, steps: int,
             decay: float = 0.8):
    """Soft cross-entropy summed over steps with weights decay^(j-1).

    target_logits [B, T, Vd]: the target's logits at each position restricted to the draft vocabulary
    (softmax over them = its distribution conditioned on the draft vocabulary); loss_mask bool[B, T]
    marks positions t whose target t+1 counts. -> (loss, {"loss_j": [J], "top1_j": [J]})."""
    logits = ttt_logits(params, embed, feats, tokens, cfg, steps)          # [J, B, T, Vd]
    p = jax.nn.softmax(_shift_left(target_logits), axis=-1)               # position t: target at t+1
    log_q = jax.nn.log_softmax(logits, axis=-1)
    T = tokens.shape[1]
    per_step, top1 = [], []
    for j in range(steps):
        valid = loss_mask & (jnp.arange(T)[None, :] >= j)                  # step j+1 needs j earlier outputs
        ce = -jnp.sum(p * log_q[j], axis=-1)
        n = jnp.maximum(valid.sum(), 1)
        per_step.append(jnp.sum(jnp.where(valid, ce, 0.0)) / n)
        agree = jnp.argmax(logits[j], -1) == jnp.argmax(p, -1)
        top1.append(jnp.sum(jnp.where(valid, agree, False)) / n)
    per_step, top1 = jnp.stack(per_step), jnp.stack(top1)
    weights = decay ** jnp.arange(steps, dtype=jnp.float32)
    return jnp.sum(weights * per_step), {"loss_j": per_step, "top1_j": top1}


def _shift_left(x: jax.Array) -> jax.Array:
    """x [B, T, ...] -> x[:, t+1] at t (last position repeats; it is masked out by callers)."""
    return jnp.concatenate([x[:, 1:], x[:, -1:]], axis=1)
