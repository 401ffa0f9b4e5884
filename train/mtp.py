"""MTP head training (DeepSeek-V3 multi-token prediction) on cached target features.

Module j at position p reads h^{j-1}_p and token_{p+j} and predicts token_{p+j+1}; its soft target is
the target's distribution at position p + j, restricted to the draft vocabulary. h^0 is the target's
last hidden state, recovered from the cached final-normed state: RMSNorm(x) only needs x / rms(x),
which is normed / g for the target's final-norm weight g, so one feature cache serves EAGLE and MTP.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.cache import init_cache
from jaxspec.drafters import MTP
from jaxspec.heads.eagle import DraftVocab
from jaxspec.heads.mtp import BLOCK_KEYS, MTPConfig, MTPHead, mtp_logits, mtp_window
from jaxspec.models import layer_params, lm_head_rows
from jaxspec.shards import read_shard, shard_names
from jaxspec.precision import project

from .features import feature_floats, shared_layers, target_features
from .heads import HeadSetup, data_settings, train_setup
from .losses import chunked_soft_ce
from .vocab import draft_vocabulary


def mtp_loss(graph: nnx.GraphDef, params: nnx.State, frozen, batch, decay: float = 0.8):
    """The training loss on one batch of cached features (train/batches.py); the head is
    nnx.merge(graph, params: its nnx.Param state, frozen["vocab"]: its DraftVocab state).

    frozen: {"embed": [V, E], "norm": [E] the target's final norm, "rows": [E, Vd] its output rows of
    the draft vocabulary, "vocab"}. Loss: sum_j decay^(j-1) * soft CE of module j: module j at p = q - j
    against the target at q, for the loss positions q (batch["loss_index"] when the batch has it: logits
    there only). -> (loss, {"loss_j", "top1_j"})."""
    feats = feature_floats(batch["feats"])                                     # [B, T, N + 1, E]
    normed = feats[:, :, -1]
    g = frozen["norm"]
    h0 = jnp.where(g != 0, normed / jnp.where(g != 0, g, 1.0), 0.0)          # direction of the last hidden state
    head = nnx.merge(graph, params, frozen["vocab"])
    cfg = head.cfg
    tokens, mask = batch["tokens"], batch["mask"]
    B, T = tokens.shape
    D = cfg.num_modules
    nxt = jnp.concatenate([tokens[:, 1:], jnp.zeros((B, D), tokens.dtype)], axis=1)   # token_{p+1}, [B, T+D-1]
    cache = init_cache(cfg.cache_config(), B, T, h0.dtype)
    hs, _ = mtp_window(head.arrays(), frozen["embed"], h0, nxt, cache, cfg, jnp.zeros((B,), jnp.int32))
    index = batch.get("loss_index", jnp.arange(B * T, dtype=jnp.int32))
    q = jnp.maximum(index, 0)
    flat = hs.reshape(D, B * T, -1)
    h = jnp.stack([flat[j - 1, jnp.maximum(q - j, 0)] for j in range(1, D + 1)])   # [D, P, E]: module j at q - j
    kept = (index >= 0) & mask.reshape(-1)[q]
    valid = jnp.stack([kept & (q % T >= j) for j in range(1, D + 1)])
    return chunked_soft_ce(lambda x: mtp_logits(frozen["norm"], frozen["rows"], x, cfg.rms_norm_eps),
                           lambda x: project(x, frozen["rows"]), h, normed.reshape(B * T, -1)[q], valid, decay)


def train_mtp(model, data_dir: str, out_dir: str, train_cfg, num_modules: int = 2, draft_vocab_size: int = 4096,
              feature_layers=None, tokens_per_batch: int = 4096, seed: int = 0, resume: bool = False,
              eval_prompts=None, eval_tokens: int = 64, progress: bool = True, on_step=None,
              until: int | None = None, answer_only: bool = False, init_from_target: bool = True,
              shards: list[str] | None = None):
    """Train D = num_modules MTP modules for `model` on the self-distilled data; save them to out_dir.

    feature_layers only names the feature cache to reuse (EAGLE's default); MTP reads its last slot.
    init_from_target: every module's block starts as a copy of the target's last layer. shards: train on these
    data shards only (default all). -> the MTP drafter."""
    setup = mtp_setup(model, data_dir, num_modules, draft_vocab_size, feature_layers, seed, init_from_target, shards)
    train_setup(model, data_dir, out_dir, train_cfg, setup, tokens_per_batch, seed, answer_only, shards,
                eval_prompts=eval_prompts, eval_tokens=eval_tokens, resume=resume, progress=progress,
                on_step=on_step, until=until)
    return MTP.load(out_dir)


def mtp_setup(model, data_dir: str, num_modules: int = 2, draft_vocab_size: int = 4096, feature_layers=None,
              seed: int = 0, init_from_target: bool = True, shards: list[str] | None = None) -> HeadSetup:
    """D = num_modules MTP modules for `model` (blocks copied from its last layer when init_from_target)
    and their training loss; feature_layers only names the shared feature cache (MTP reads its last slot)."""
    vocab = model.config.vocab_size
    cfg = MTPConfig.for_target(model.config, num_modules, min(draft_vocab_size, vocab))
    d2t, coverage = draft_vocabulary(data_dir, vocab, cfg.draft_vocab_size, names=shards)
    block = ({k: layer_params(model.params, -1)[k] for k in BLOCK_KEYS} if init_from_target else None)
    head = MTPHead.init(cfg, rngs=nnx.Rngs(seed), d2t=d2t, block=block)
    if init_from_target:          # the copied layer adds to a residual of the size it had in the target
        size = last_layer_input_rms(model, data_dir, shards)
        for module in head.modules:
            module.h_norm[...] = jnp.full_like(module.h_norm[...], size)
    graph, params, vocab = nnx.split(head, nnx.Param, DraftVocab)
    frozen = {"embed": model.params["embed"], "norm": model.params["norm"], "rows": lm_head_rows(model.params, d2t),
              "vocab": vocab}
    settings = {"kind": "mtp", "target": model.source, "target_fingerprint": model.fingerprint,
                "data": data_settings(data_dir), "draft_vocab_size": cfg.draft_vocab_size, "num_modules": num_modules,
                "seed": seed, "init_from_target": init_from_target}
    return HeadSetup("mtp", lambda p, fz, b: mtp_loss(graph, p, fz, b), params, frozen,
                     lambda p: MTP(nnx.merge(graph, p, vocab)), settings, shared_layers(model, feature_layers),
                     training_meta={"num_modules": num_modules, "init_from_target": init_from_target},
                     data_meta={"draft_vocab_coverage": round(coverage, 4)})


def last_layer_input_rms(model, data_dir: str, shards: list[str] | None = None, rows: int = 4,
                         length: int = 256) -> float:
    """The root-mean-square of the target's residual stream entering its last layer, over the first
    `rows` examples of the data (first `length` tokens): the size of the state the last layer, copied into
    each module, was trained to add to (on Gemma 3 about 10^3, so a unit-size input would drown in its
    update)."""
    cfg = model.config
    seqs = read_shard(data_dir, (shards or shard_names(data_dir))[0])[0][:rows]
    tokens = np.zeros((len(seqs), length), np.int32)
    valid = np.zeros((len(seqs), length), bool)
    for i, seq in enumerate(seqs):
        tokens[i, :min(len(seq), length)], valid[i, :min(len(seq), length)] = seq[:length], True
    hidden = target_features(model.params, jnp.asarray(tokens), cfg, (cfg.num_layers - 1,))[:, :, 0]   # [B, T, E]
    squares = np.mean(np.square(np.asarray(hidden, np.float32)), axis=-1)            # [B, T]
    return float(np.sqrt(squares[valid].mean()))
