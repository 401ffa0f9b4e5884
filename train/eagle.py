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
from flax import nnx

from jaxspec.drafters import Eagle
from jaxspec.heads.eagle import DraftVocab, EagleConfig, EagleHead
from jaxspec.models import lm_head_rows
from jaxspec.precision import project

from .features import feature_floats
from .heads import HeadSetup, data_settings, train_setup
from .losses import chunked_soft_ce
from .vocab import draft_vocabulary


def _shift(x: jax.Array, by: int) -> jax.Array:
    """x [B, T, ...] moved `by` positions later along T (the first `by` positions zero)."""
    if by == 0:
        return x
    return jnp.concatenate([jnp.zeros_like(x[:, :by]), x[:, :-by]], axis=1)


def ttt_logits(head: EagleHead, embed: jax.Array, feats: jax.Array, tokens: jax.Array, steps: int,
               rows: jax.Array) -> jax.Array:
    """feats [N, B, T, E] target features, tokens int32[B, T], rows [E, Vd] (head.output_rows) -> draft
    logits [J, B, T, Vd]."""
    return head.logits(ttt_hidden(head, embed, feats, tokens, steps), rows)


def ttt_hidden(head: EagleHead, embed: jax.Array, feats: jax.Array, tokens: jax.Array, steps: int) -> jax.Array:
    """feats [N, B, T, E] target features, tokens int32[B, T] -> the head's output states [J, B, T, E]."""
    B, T = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    nxt = jnp.concatenate([tokens[:, 1:], jnp.zeros((B, 1), tokens.dtype)], axis=1)   # token_{t+1}
    feature = head.fuse(feats)
    t_idx = jnp.arange(T)
    keys, values, states = [], [], []
    for j in range(1, steps + 1):
        q, k, v = head.qkv(embed, feature, nxt, pos)
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
        h = head.hidden(feature, out.reshape(B, T, H, D).astype(feature.dtype))
        states.append(h)
        feature = _shift(h, 1)                                  # step j+1 at t reads h^j_{t-1}
    return jnp.stack(states)


def ttt_loss(head: EagleHead, embed, feats, tokens, target_logits, loss_mask, steps: int, rows: jax.Array,
             decay: float = 0.8, loss_index=None):
    """Soft cross-entropy summed over steps with weights decay^(j-1).

    target_logits: the target's logits restricted to the draft vocabulary (softmax over them = its
    distribution conditioned on the draft vocabulary), [B, T, Vd], or (states [B, T, E], rows [E, Vd]) to
    compute them from; loss_mask bool[B, T] marks positions t whose target t+1 counts; loss_index int32[P]:
    the flat positions b*T + t to score (-1: padding; default all), so logits are computed at loss
    positions only, a chunk at a time (losses.chunked_soft_ce). -> (loss, {"loss_j": [J], "top1_j": [J]})."""
    hs = ttt_hidden(head, embed, feats, tokens, steps)                      # [J, B, T, E]
    J, B, T, E = hs.shape
    index = jnp.arange(B * T, dtype=jnp.int32) if loss_index is None else loss_index
    at = jnp.maximum(index, 0)
    after = jnp.minimum(at + 1, B * T - 1)                                  # position t: target at t+1
    if isinstance(target_logits, tuple):
        states, target_rows = target_logits
        target_x, target_fn = states.reshape(B * T, -1)[after], lambda x: project(x, target_rows)
    else:
        target_x, target_fn = target_logits.reshape(B * T, -1)[after], lambda x: x
    scored = (index >= 0) & loss_mask.reshape(-1)[at]
    valid = jnp.stack([scored & (at % T >= j) for j in range(steps)])     # step j+1 needs j earlier outputs
    return chunked_soft_ce(lambda h: head.logits(h, rows), target_fn, hs.reshape(J, B * T, E)[:, at], target_x,
                           valid, decay)


def eagle_loss(graph: nnx.GraphDef, params: nnx.State, frozen, batch, steps: int):
    """The training loss on one batch of cached features (train/batches.py); the head is
    nnx.merge(graph, params: its nnx.Param state, frozen["vocab"]: its DraftVocab state).

    frozen: {"embed": [V, E] target embeddings, "target_head": [E, Vd] the target's output rows of the
    draft vocabulary, "vocab"}. batch["feats"]: the cached features (layout in train/features.py); the
    final normed state (slot N) times target_head gives the target's draft-vocabulary logits."""
    feats = feature_floats(batch["feats"])                                     # [B, T, N + 1, E]
    head = nnx.merge(graph, params, frozen["vocab"])
    return ttt_loss(head, frozen["embed"], feats[:, :, :-1].transpose(2, 0, 1, 3), batch["tokens"],
                    (feats[:, :, -1], frozen["target_head"]), batch["mask"], steps,
                    head.output_rows(frozen["target_head"]), loss_index=batch.get("loss_index"))


def train_eagle(model, data_dir: str, out_dir: str, train_cfg, draft_vocab_size: int = 8192,
                ttt_steps: int = 5, feature_layers=None, tied_head: bool = False, tokens_per_batch: int = 4096, seed: int = 0,
                resume: bool = False, eval_prompts=None, eval_tokens: int = 64, progress: bool = True,
                on_step=None, until: int | None = None, answer_only: bool = False, shards: list[str] | None = None):
    """Train an EAGLE head for `model` on the self-distilled data in data_dir; save it to out_dir.

    Returns the Eagle drafter. eval_prompts (token-id lists) are decoded with the head every
    train_cfg.eval_every steps and at the end; the last result goes into the head's metadata. shards: train
    on these data shards only (default all; train/scaling.py). tied_head: the head drafts through the
    target's frozen output rows of the draft vocabulary instead of its own (heads/eagle.py)."""
    setup = eagle_setup(model, data_dir, draft_vocab_size, ttt_steps, feature_layers, tied_head, seed, shards)
    train_setup(model, data_dir, out_dir, train_cfg, setup, tokens_per_batch, seed, answer_only, shards,
                eval_prompts=eval_prompts, eval_tokens=eval_tokens, resume=resume, progress=progress,
                on_step=on_step, until=until)
    return Eagle.load(out_dir)


def eagle_setup(model, data_dir: str, draft_vocab_size: int = 8192, ttt_steps: int = 5, feature_layers=None,
                tied_head: bool = False, seed: int = 0, shards: list[str] | None = None) -> HeadSetup:
    """An EAGLE head initialised for `model` (draft vocabulary from the data, output norm the target's)
    and its training loss; batches bring the target's features (cached, or computed in the step)."""
    vocab = model.config.vocab_size
    cfg = EagleConfig.for_target(model.config, min(draft_vocab_size, vocab), feature_layers, tied_head)
    d2t, coverage = draft_vocabulary(data_dir, vocab, cfg.draft_vocab_size, names=shards)
    target_head = lm_head_rows(model.params, d2t)
    head = EagleHead.init(cfg, rngs=nnx.Rngs(seed), d2t=d2t, lm_head=target_head)
    head.norm[...] = jnp.array(model.params["norm"], head.norm.dtype)           # the target's output norm
    graph, params, vocab = nnx.split(head, nnx.Param, DraftVocab)
    settings = {"kind": "eagle", "target": model.source, "target_fingerprint": model.fingerprint,
                "data": data_settings(data_dir), "draft_vocab_size": cfg.draft_vocab_size, "ttt_steps": ttt_steps,
                "feature_layers": list(cfg.feature_layers), **({"tied_head": True} if tied_head else {}), "seed": seed}
    return HeadSetup("eagle", lambda p, fz, b: eagle_loss(graph, p, fz, b, ttt_steps), params,
                     {"embed": model.params["embed"], "target_head": target_head, "vocab": vocab},
                     lambda p: Eagle(nnx.merge(graph, p, vocab)), settings, cfg.feature_layers,
                     training_meta={"ttt_steps": ttt_steps}, data_meta={"draft_vocab_coverage": round(coverage, 4)})
