"""Target features for head training, computed once and cached on local disk (never committed).

For every stored example the target runs once over prompt + answer and we keep, per token, the
hidden states the head reads (its feature layers) and the target's final normed hidden state, from
which the target's logits over any draft vocabulary are one small matmul.

The layout (the one place it is written down; batches.py and the losses read it):
  DATA/features-<layers joined by "-">/   e.g. features-2-15-28 for EAGLE's default on SmolLM2
    features.json      {"fingerprint": the target's, "layers": [N indices], "shards": {shard name: rows}}
    <shard name>.npy   uint16[tokens, N + 1, E]: bfloat16 bits; slot n < N the residual stream after
                       layer layers[n] (0 = embeddings), slot N the final normed hidden state; rows in
                       the shard's token order (its examples' prompt + answer, concatenated)
Each .npy is written atomically, so a killed run resumes at the first missing shard. MTP and the
draft model read slot N only, so they share EAGLE's folder (shared_layers).
"""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from jaxspec.cache import init_cache
from jaxspec.decode.batch import bucket
from jaxspec.models.llama import forward_hidden

from .data import read_manifest, read_shard, shard_names

INDEX = "features.json"


def _to_bits(x):
    return jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)


def target_features(params, tokens, cfg, layers) -> jax.Array:
    """tokens int32[B, T] -> float32[B, T, N + 1, E]: the feature layers and the final normed state (the
    cache's layout, in float)."""
    B, T = tokens.shape
    x, hidden, _ = forward_hidden(params, tokens, init_cache(cfg, B, T, params["embed"].dtype), cfg, layers)
    return jnp.concatenate([hidden, x[None]], axis=0).transpose(1, 2, 0, 3)


def _hidden(params, tokens, cfg, layers):
    """tokens int32[B, T] -> bfloat16 bits uint16[B, T, N + 1, E] of target_features."""
    return _to_bits(target_features(params, tokens, cfg, layers))


_hidden_jit = jax.jit(_hidden, static_argnames=("cfg", "layers"))


def shared_layers(model, feature_layers=None) -> tuple:
    """The feature layers whose cache MTP and draft-model training reuse: EAGLE's (default low, middle,
    high), since those trainers read only the cache's last slot (the final normed state)."""
    from jaxspec.heads.eagle import EagleConfig
    return EagleConfig.for_target(model.config, 1, feature_layers).feature_layers


def feature_dir(data_dir: str, layers) -> str:
    return os.path.join(data_dir, "features-" + "-".join(map(str, layers)))


def cache_features(model, data_dir: str, layers, tokens_per_batch: int = 4096, progress: bool = True,
                   names: list[str] | None = None) -> str:
    """Compute (or resume) the cached features of every data shard (or of the shards `names`); -> the
    feature folder."""
    layers = tuple(int(j) for j in layers)
    fingerprint = read_manifest(data_dir)["fingerprint"]
    if fingerprint != model.fingerprint:
        raise ValueError(f"the data in {data_dir} was made by a target with weights "
                         f"{fingerprint}, not this one ({model.fingerprint})")
    out = feature_dir(data_dir, layers)
    os.makedirs(out, exist_ok=True)
    index_path = os.path.join(out, INDEX)
    index = {"fingerprint": model.fingerprint, "layers": list(layers), "shards": {}}
    if os.path.isfile(index_path):
        with open(index_path) as f:
            old = json.load(f)
        if (old["fingerprint"], old["layers"]) == (index["fingerprint"], index["layers"]):
            index = old
    names = shard_names(data_dir) if names is None else names
    todo = [n for n in names if index["shards"].get(n) is None or not os.path.isfile(_npy(out, n))]
    bar = tqdm(total=len(names), initial=len(names) - len(todo), unit="shard", desc="target features",
               disable=not progress)
    for name in todo:
        seqs = read_shard(data_dir, name)[0]
        rows = np.zeros((sum(len(s) for s in seqs), len(layers) + 1, model.config.hidden_size), np.uint16)
        starts = np.concatenate([[0], np.cumsum([len(s) for s in seqs])[:-1]]).astype(int)
        order = np.argsort([len(s) for s in seqs], kind="stable")
        i = 0
        while i < len(order):
            T = bucket(len(seqs[order[i]]), 64)
            B = max(1, tokens_per_batch // T)
            group = [g for g in order[i:i + B] if len(seqs[g]) <= T]
            T = bucket(max(len(seqs[g]) for g in group), 64)
            # rows padded to a power of two (at most B): a few compiled shapes per T, not one per group size
            batch = np.zeros((min(B, bucket(len(group), 1)), T), np.int32)
            for r, g in enumerate(group):
                batch[r, :len(seqs[g])] = seqs[g]
            bits = np.asarray(_hidden_jit(model.params, jnp.asarray(batch), model.config, layers))
            for r, g in enumerate(group):
                rows[starts[g]:starts[g] + len(seqs[g])] = bits[r, :len(seqs[g])]
            i += len(group)
        tmp = _npy(out, name) + ".tmp.npy"
        np.save(tmp, rows)
        os.replace(tmp, _npy(out, name))
        index["shards"][name] = int(rows.shape[0])
        with open(index_path, "w") as f:
            json.dump(index, f, indent=1)
        bar.update(1)
    bar.close()
    return out


def _npy(out: str, shard: str) -> str:
    return os.path.join(out, shard.replace(".npz", ".npy"))


def load_features(feat_dir: str, names: list[str]) -> list[np.ndarray]:
    """Memory-mapped uint16[tokens, N + 1, E] (bfloat16 bits) per data shard, in the order of `names`."""
    with open(os.path.join(feat_dir, INDEX)) as f:
        index = json.load(f)
    out = []
    for name in names:
        if name not in index["shards"] or not os.path.isfile(_npy(feat_dir, name)):
            raise ValueError(f"{feat_dir} has no features for {name}: run the feature cache again")
        try:
            arr = np.load(_npy(feat_dir, name), mmap_mode="r")
        except Exception as e:
            raise ValueError(f"cannot read cached features {_npy(feat_dir, name)}: {e}") from e
        if arr.shape[0] != index["shards"][name]:
            raise ValueError(f"cached features {_npy(feat_dir, name)} are truncated")
        out.append(arr)
    return out


def bits_to_float(bits) -> jax.Array:
    """uint16 bfloat16 bits -> float32."""
    return jax.lax.bitcast_convert_type(jnp.asarray(bits, jnp.uint16), jnp.bfloat16).astype(jnp.float32)


def feature_floats(feats) -> jax.Array:
    """A batch's features [B, T, N + 1, E] as float32: cached bfloat16 bits converted, features the step
    computed (train/joint.py) as they are."""
    return bits_to_float(feats) if feats.dtype == jnp.uint16 else feats.astype(jnp.float32)
