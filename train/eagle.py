"""EAGLE head training: the training-time test (EAGLE-3, Li et al. 2025) and its loss.

Step 1 reads the pairs (fused target feature_t, token_{t+1}) at every position. Step j > 1 reads
(h^{j-1}_{t-1}, token_{t+1}): the head's own output one position back, as when drafting the j-th
token. Its query at t sees what the cache would hold then: step-1 keys at s <= t-j+1 and the key
of step i at s = t-j+i for i = 2..j (a diagonal per step). Position t of step j predicts
token_{t+2}; its soft target is the target's distribution at t+1, restricted to the draft vocabulary.
"""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp

from jaxspec.drafters import Eagle
from jaxspec.heads.eagle import (
    EagleConfig,
    eagle_out,
    eagle_qkv,
    fuse_features,
    init_eagle_params,
)

from . import loop
from .acceptance import acceptance
from .batches import FeatureBatches
from .data import MANIFEST, summary
from .features import bits_to_float, cache_features
from .plots import plot_run
from .vocab import draft_vocabulary


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


def eagle_loss(params, frozen, batch, cfg: EagleConfig, steps: int):
    """The training loss on one batch of cached features (train/batches.py).

    frozen: {"embed": [V, E] target embeddings, "target_head": [E, Vd] the target's output rows of the
    draft vocabulary, "d2t": int32[Vd]}. feats hold the N feature layers then the target's final
    normed hidden state, whose product with target_head gives the target's draft-vocabulary logits."""
    feats = bits_to_float(batch["feats"])                                     # [B, T, N + 1, E]
    target_logits = jnp.einsum("bte,ev->btv", feats[:, :, -1], frozen["target_head"],
                               preferred_element_type=jnp.float32)
    head = {**params, "d2t": frozen["d2t"]}
    return ttt_loss(head, frozen["embed"], feats[:, :, :-1].transpose(2, 0, 1, 3), batch["tokens"],
                    target_logits, batch["mask"], cfg, steps)


def target_head_rows(target_params, d2t) -> jax.Array:
    """The target's output matrix restricted to the draft vocabulary: [E, Vd]."""
    if "lm_head" in target_params:
        return target_params["lm_head"][:, d2t]
    return target_params["embed"][d2t].T


def train_eagle(model, data_dir: str, out_dir: str, train_cfg, draft_vocab_size: int = 8192,
                ttt_steps: int = 5, feature_layers=None, tokens_per_batch: int = 4096, seed: int = 0,
                resume: bool = False, eval_prompts=None, eval_tokens: int = 64, progress: bool = True,
                on_step=None, until: int | None = None, answer_only: bool = False):
    """Train an EAGLE head for `model` on the self-distilled data in data_dir; save it to out_dir.

    Returns the Eagle drafter. eval_prompts (token-id lists) are decoded with the head every
    train_cfg.eval_every steps and at the end; the last result goes into the head's metadata."""
    vocab = model.config.vocab_size
    cfg = EagleConfig.for_target(model.config, min(draft_vocab_size, vocab), feature_layers)
    d2t, coverage = draft_vocabulary(data_dir, vocab, cfg.draft_vocab_size)
    feat_dir = cache_features(model, data_dir, cfg.feature_layers, progress=progress)
    batches = FeatureBatches(data_dir, feat_dir, tokens_per_batch, rows_multiple=jax.device_count(), seed=seed,
                             answer_only=answer_only)
    target_head = target_head_rows(model.params, d2t)
    params = init_eagle_params(cfg, jax.random.PRNGKey(seed), d2t=d2t, lm_head=target_head)
    params["norm"] = jnp.array(model.params["norm"], params["norm"].dtype)   # the target's output norm
    d2t = params.pop("d2t")
    frozen = {"embed": model.params["embed"], "target_head": target_head, "d2t": d2t}
    with open(os.path.join(data_dir, MANIFEST)) as f:
        data_settings = json.load(f)["settings"]
    settings = {"kind": "eagle", "target": model.source, "target_fingerprint": model.fingerprint,
                "data": data_settings, "draft_vocab_size": cfg.draft_vocab_size, "ttt_steps": ttt_steps,
                "feature_layers": list(cfg.feature_layers), "tokens_per_batch": tokens_per_batch, "seed": seed,
                "examples": len(batches.seqs), **({"answer_only": True} if answer_only else {})}
    metadata = {"target": model.source, "target_fingerprint": model.fingerprint}

    def drafter_of(p):
        return Eagle({**p, "d2t": d2t}, cfg, metadata)

    evaluate = (lambda p: acceptance(model, drafter_of(p), eval_prompts, eval_tokens)) if eval_prompts else None
    loss_fn = lambda p, fz, b: eagle_loss(p, fz, b, cfg, ttt_steps)
    params, done = loop.fit(loss_fn, params, frozen, batches, train_cfg, out_dir, settings, resume=resume,
                            evaluate=evaluate, progress=progress, on_step=on_step, until=until)
    records = loop.read_metrics(out_dir)
    evals = [{"step": r["step"], **r["eval"]} for r in records if "eval" in r]
    steps = [r for r in records if "eval" not in r]
    last_eval, record = (evals[-1] if evals else None), (steps[-1] if steps else {})
    if evaluate and (last_eval is None or last_eval["step"] != done):     # e.g. a resume with nothing left to run
        result = evaluate(params)
        loop.append_metrics(out_dir, {"step": done, "eval": result})
        last_eval = {"step": done, **result}
    train_seconds = (round(sum(r["seconds"] for r in steps), 1)           # None if a record lacks its time
                     if steps and all("seconds" in r for r in steps) else None)
    counts = summary(data_dir)
    metadata.update({
        "data": {**counts, "tokens_trained_on": batches.num_tokens, "draft_vocab_coverage": round(coverage, 4),
                 "prompts_file": data_settings["prompts_file"]},
        "training": {"steps": done, "schedule_steps": train_cfg.steps, "answer_only": answer_only,
                     "ttt_steps": ttt_steps, "tokens_per_batch": tokens_per_batch, "lr": train_cfg.lr,
                     "final_loss": record.get("loss"), "final_top1": record.get("top1_j"),
                     "train_seconds": train_seconds},
        "heldout_acceptance": last_eval})
    drafter_of(params).save(out_dir)                      # bfloat16 on disk
    plot_run(out_dir)
    return Eagle.load(out_dir)
