"""Static-shape KV cache with per-row lengths.

k, v: [L, B, S, G, D]; length: int32[B]. A forward writes its T new tokens at each row's own
offset `length[b] + t`; slots at or beyond a row's length are masked, never trusted, never
erased. Rollback after verification only changes `length`.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from . import rowwise
from .config import ModelConfig


class KVCache(NamedTuple):
    k: jax.Array       # [L, B, S, G, D]
    v: jax.Array       # [L, B, S, G, D]
    length: jax.Array  # int32[B], valid slots per row

    @property
    def capacity(self) -> int:
        return self.k.shape[2]


def init_cache(cfg: ModelConfig, batch: int, capacity: int, dtype=jnp.float32) -> KVCache:
    """An empty cache of `capacity` slots (S) per row."""
    shape = (cfg.num_layers, batch, capacity, cfg.num_kv_heads, cfg.head_dim)
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch,), jnp.int32))


def positions(cache: KVCache, num_tokens: int) -> jax.Array:
    """int32[B, T]: the slot (= RoPE position) of each of the T new tokens of every row."""
    return cache.length[:, None] + jnp.arange(num_tokens, dtype=jnp.int32)[None, :]


def write_layer(cache: KVCache, layer, k_new: jax.Array, v_new: jax.Array, pos: jax.Array) -> KVCache:
    """Write k_new, v_new [B, T, G, D] into layer `layer` at slots pos[B, T] (out-of-range slots dropped)."""
    return cache._replace(k=rowwise.scatter(cache.k, pos, k_new, lead=(layer,)),
                          v=rowwise.scatter(cache.v, pos, v_new, lead=(layer,)))


def attention_mask(pos: jax.Array, capacity: int) -> jax.Array:
    """bool[B, T, S]: a query at position p sees slots s <= p of its own row (causal, per-row length)."""
    return jnp.arange(capacity, dtype=jnp.int32)[None, None, :] <= pos[:, :, None]


def advance(cache: KVCache, num_tokens) -> KVCache:
    """Lengths grow by num_tokens (int or int32[B]) after a forward has written them."""
    return cache._replace(length=cache.length + jnp.asarray(num_tokens, jnp.int32))


def rollback(cache: KVCache, length: jax.Array) -> KVCache:
    """Keep only the first length[b] slots of each row: a masked length change, nothing erased."""
    return cache._replace(length=jnp.asarray(length, jnp.int32))


def keep_path(cache: KVCache, start: jax.Array, path: jax.Array) -> KVCache:
    """After a tree pass wrote its inputs at slots start[b] + j (j = 0: `last`, j = 1 + i: node i), move
    the kept path's entries, path int32[B, D] (node indices from the top, -1 past the kept ones), to
    the slots right after `last`, start + 1 + level, in every layer; length = start + 1 + kept nodes.
    The other nodes' slots lie past the length: dropped, never erased (jaxspec/tree.py)."""
    B, D = path.shape
    kept = jnp.sum(path >= 0, axis=1).astype(jnp.int32)
    src = start[:, None] + 1 + jnp.maximum(path, 0)                            # [B, D]
    dst = jnp.where(path >= 0, start[:, None] + 1 + jnp.arange(D), cache.capacity)   # out of range: dropped
    move = lambda x: rowwise.scatter(x, dst, rowwise.gather(x, src, axis=1), axis=1)
    return KVCache(move(cache.k), move(cache.v), start + 1 + kept)
