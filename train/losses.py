"""Soft cross-entropy against the target's distribution, per draft step, with decaying weights."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxspec.flops import scan_unroll


def shift_left(x: jax.Array, by: int = 1) -> jax.Array:
    """x [B, T, ...] -> x[:, t + by] at t (the last `by` positions repeat x[:, -1]; callers mask them)."""
    if by == 0:
        return x
    return jnp.concatenate([x[:, by:]] + [x[:, -1:]] * by, axis=1)


def total_variation(logits: jax.Array, target_logits: jax.Array, valid: jax.Array):
    """logits, target_logits [B, T, V], valid bool[B, T] -> (mean TV distance 1/2 sum_v |p - q|, {"loss_j": [1],
    "top1_j": [1]}). One minus it is the chance that a token drawn from q is accepted under p (Leviathan et
    al. 2023); DistillSpec (Zhou et al. 2024) distils drafters with it."""
    p, q = jax.nn.softmax(target_logits, axis=-1), jax.nn.softmax(logits, axis=-1)
    tv = 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)
    n = jnp.maximum(valid.sum(), 1)
    loss = jnp.sum(jnp.where(valid, tv, 0.0)) / n
    agree = jnp.argmax(logits, -1) == jnp.argmax(target_logits, -1)
    return loss, {"loss_j": loss[None], "top1_j": (jnp.sum(jnp.where(valid, agree, False)) / n)[None]}


def stepwise_soft_ce(logits: jax.Array, target_logits: jax.Array, shifts, valid, decay: float = 0.8):
    """logits [J, B, T, Vd]: draft step j's logits at each position; target_logits [B, T, Vd];
    step j's soft target at t is softmax(target_logits[:, t + shifts[j]]); valid [J] of bool[B, T].
    -> (sum_j decay^j * mean CE_j, {"loss_j": [J], "top1_j": [J] argmax agreement})."""
    per_step, top1, targets = [], [], {}
    log_q = jax.nn.log_softmax(logits, axis=-1)
    for j, s in enumerate(shifts):
        if s not in targets:
            targets[s] = jax.nn.softmax(shift_left(target_logits, s), axis=-1)
        p = targets[s]
        ce = -jnp.sum(p * log_q[j], axis=-1)
        n = jnp.maximum(valid[j].sum(), 1)
        per_step.append(jnp.sum(jnp.where(valid[j], ce, 0.0)) / n)
        agree = jnp.argmax(logits[j], -1) == jnp.argmax(p, -1)
        top1.append(jnp.sum(jnp.where(valid[j], agree, False)) / n)
    per_step, top1 = jnp.stack(per_step), jnp.stack(top1)
    weights = decay ** jnp.arange(len(shifts), dtype=jnp.float32)
    return jnp.sum(weights * per_step), {"loss_j": per_step, "top1_j": top1}


def chunked_soft_ce(draft_logits, target_logits, h: jax.Array, x: jax.Array, valid: jax.Array,
                    decay: float = 0.8, chunk: int = 256):
    """Soft cross-entropy of J draft steps against one target distribution per position, `chunk`
    positions at a time: no [J, P, V] array is ever whole (each chunk's logits are recomputed in the
    backward pass), so the softmaxes stay in cache instead of streaming gigabytes through memory.

    h [J, P, E] draft states and x [P, E] target states (or the target's logits themselves);
    draft_logits(h_c [J, C, E]) -> [J, C, V], target_logits(x_c [C, E]) -> [C, V]; valid bool[J, P].
    CE = logsumexp(q) - sum_v p_v q_v per position. -> (sum_j decay^j * mean CE_j, {"loss_j", "top1_j"})."""
    J, P = valid.shape
    pad = (-P) % chunk if P > chunk else 0
    C = chunk if P > chunk else P
    h, x = jnp.pad(h, ((0, 0), (0, pad), (0, 0))), jnp.pad(x, ((0, pad), (0, 0)))
    valid = jnp.pad(valid, ((0, 0), (0, pad)))
    n = (P + pad) // C
    chunks = (h.reshape(J, n, C, -1).swapaxes(0, 1), x.reshape(n, C, -1), valid.reshape(J, n, C).swapaxes(0, 1))

    @jax.checkpoint
    def one(hb, xb, vb):
        q, t = draft_logits(hb), target_logits(xb)                             # [J, C, V], [C, V]
        ce = jax.nn.logsumexp(q, axis=-1) - jnp.einsum("cv,jcv->jc", jax.nn.softmax(t, axis=-1), q)
        agree = jnp.argmax(q, -1) == jnp.argmax(t, -1)[None]
        return jnp.sum(jnp.where(vb, ce, 0.0), -1), jnp.sum(vb & agree, -1)

    def body(carry, chunk_args):
        ce, top = one(*chunk_args)
        return (carry[0] + ce, carry[1] + top), None

    zero = (jnp.zeros(J), jnp.zeros(J, jnp.int32))
    (ce_sum, top_sum), _ = jax.lax.scan(body, zero, chunks, unroll=scan_unroll())
    count = jnp.maximum(valid.sum(-1), 1)
    per_step, top1 = ce_sum / count, top_sum / count
    weights = decay ** jnp.arange(J, dtype=jnp.float32)
    return jnp.sum(weights * per_step), {"loss_j": per_step, "top1_j": top1}
