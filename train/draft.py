"""Distil a small independent draft model (a Llama config on the target's tokenizer) from the target's
output distributions (forward KL, Hinton et al. 2015; as a drafter, Leviathan et al. 2023).

The draft model is narrow (width E_d) with tied embeddings, so its embedding table, the bulk of its
weights, stays small. That table starts as the target's embeddings projected on their top E_d
principal directions; the layers start random. Loss at position t: soft cross-entropy between the
target's distribution for token t+1 (recomputed from the cached final-normed state) and the draft's.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxspec.cache import init_cache
from jaxspec.config import ModelConfig
from jaxspec.drafters import DraftModel
from jaxspec.model import Model
from jaxspec.models import init_params, lm_head
from jaxspec.models.llama import forward_hidden
from jaxspec.models.module import LlamaModule

from .features import feature_floats, shared_layers
from .heads import HeadSetup, data_settings, train_setup
from .losses import chunked_soft_ce, total_variation

LOSSES = ("kl", "tv")


def draft_config(target: ModelConfig, hidden_size: int = 192, num_layers: int = 4, head_dim: int = 64,
                 num_kv_heads: int = 1, mlp_ratio: int = 3) -> ModelConfig:
    """A narrow Llama config on the target's vocabulary, tied embeddings."""
    if hidden_size % head_dim:
        raise ValueError(f"hidden_size {hidden_size} must be a multiple of head_dim {head_dim}")
    heads = hidden_size // head_dim
    if heads % num_kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of num_kv_heads {num_kv_heads}")
    return dataclasses.replace(target, hidden_size=hidden_size, intermediate_size=mlp_ratio * hidden_size,
                               num_layers=num_layers, num_heads=heads, num_kv_heads=num_kv_heads,
                               head_dim=head_dim, tie_word_embeddings=True, qkv_bias=False,
                               architecture="llama")


def projected_embeddings(embed: jax.Array, width: int) -> jax.Array:
    """Target embeddings [V, E] on their top `width` principal directions -> [V, width], rescaled to the
    target's per-coordinate RMS."""
    x = np.asarray(embed, np.float64)
    cov = (x - x.mean(0)).T @ (x - x.mean(0))
    _, vecs = np.linalg.eigh(cov)                                  # ascending eigenvalues
    y = x @ vecs[:, ::-1][:, :width]
    y *= np.sqrt((x ** 2).mean() / (y ** 2).mean())
    return jnp.asarray(y, jnp.float32)


def draft_loss(graph: nnx.GraphDef, params: nnx.State, frozen, batch, loss: str = "kl"):
    """Soft cross-entropy ("kl": forward KL up to a constant) or total variation ("tv") to the target's
    full-vocabulary distribution at every kept position; the draft model is nnx.merge(graph, params).
    frozen: {"target_out": the target's output params ({"embed"} or {"lm_head"})}. Logits are computed at
    batch["loss_index"] only when the batch has it (train/batches.py). -> (loss, metrics)."""
    feats = feature_floats(batch["feats"])                                     # [B, T, N + 1, E]
    tokens = batch["tokens"]
    B, T = tokens.shape
    lm = nnx.merge(graph, params)
    p = lm.params()
    x, _, _ = forward_hidden(p, tokens, init_cache(lm.cfg, B, T, p["embed"].dtype), lm.cfg)
    index = batch.get("loss_index", jnp.arange(B * T, dtype=jnp.int32))
    at = jnp.maximum(index, 0)
    h, target_x = x.reshape(B * T, -1)[at], feats[:, :, -1].reshape(B * T, -1)[at]      # [P, E] each
    valid = ((index >= 0) & batch["mask"].reshape(-1)[at])[None]
    if loss == "tv":
        return total_variation(lm_head(p, h)[None], lm_head(frozen["target_out"], target_x)[None], valid)
    return chunked_soft_ce(lambda c: lm_head(p, c), lambda c: lm_head(frozen["target_out"], c), h[None], target_x,
                           valid, decay=1.0)


def train_draft(model, data_dir: str, out_dir: str, train_cfg, hidden_size: int = 192, num_layers: int = 4,
                feature_layers=None, tokens_per_batch: int = 2048, seed: int = 0, resume: bool = False,
                eval_prompts=None, eval_tokens: int = 64, progress: bool = True, on_step=None,
                until: int | None = None, answer_only: bool = False, init: str | None = None, loss: str = "kl",
                shards: list[str] | None = None, **config_kw):
    """Distil a draft model of width hidden_size and num_layers layers from `model`; save it to out_dir
    (a Hugging Face folder + draft.json). feature_layers only names the feature cache to reuse.
    init: a saved draft model folder to start from (its shape replaces hidden_size and num_layers), e.g.
    for on-policy fine-tuning on answers it wrote itself; loss: "kl" or "tv" (draft_loss). shards: train on
    these data shards only (default all). -> the DraftModel."""
    setup = draft_setup(model, data_dir, hidden_size, num_layers, feature_layers, seed, init, loss, **config_kw)
    train_setup(model, data_dir, out_dir, train_cfg, setup, tokens_per_batch, seed, answer_only, shards,
                eval_prompts=eval_prompts, eval_tokens=eval_tokens, resume=resume, progress=progress,
                on_step=on_step, until=until)
    return DraftModel.load(out_dir)


def draft_setup(model, data_dir: str, hidden_size: int = 192, num_layers: int = 4, feature_layers=None,
                seed: int = 0, init: str | None = None, loss: str = "kl", **config_kw) -> HeadSetup:
    """A draft model for `model` (embeddings: the target's projected, or a saved draft's when init) and its
    distillation loss; feature_layers only names the shared feature cache (the loss reads its last slot)."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    start = DraftModel.load(init) if init else None
    if start is not None:
        start.check_target(model)
        hidden_size, num_layers = start.model.config.hidden_size, start.model.config.num_layers
    cfg = (start.model.config if start is not None
           else draft_config(model.config, hidden_size, num_layers, **config_kw))
    if start is not None:
        params = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), start.model.params)
    else:
        params = init_params(cfg, jax.random.PRNGKey(seed), scale=0.02)
        params["embed"] = projected_embeddings(model.params["embed"], hidden_size)
    out = ({"lm_head": model.params["lm_head"]} if "lm_head" in model.params else {"embed": model.params["embed"]})
    settings = {"kind": "draft", "target": model.source, "target_fingerprint": model.fingerprint,
                "data": data_settings(data_dir), "config": dataclasses.asdict(cfg), "seed": seed, "loss": loss,
                **({"init": init} if init else {})}
    graph, params = nnx.split(LlamaModule(cfg, params))
    drafter_of = lambda p: DraftModel(Model(cfg, nnx.merge(graph, p).params(), model.tokenizer,
                                            f"draft for {model.source}"))
    meta = {"loss": loss, **({"init": init, "init_metadata": start.metadata.to_dict()} if start is not None else {}),
            "parameters": cfg.num_params, "target_parameters": model.config.num_params}
    return HeadSetup("draft", lambda p, fz, b: draft_loss(graph, p, fz, b, loss), params, {"target_out": out},
                     drafter_of, settings, shared_layers(model, feature_layers), training_meta=meta)
