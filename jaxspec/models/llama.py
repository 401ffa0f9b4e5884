"""Llama-family decoder (SmolLM2, Llama 2/3, Mistral, Qwen2) as pure functions; Gemma 3 differs in
its layer (models/gemma.py) and shares the rest.

Params pytree:
  embed [V, E]; norm [E]; lm_head [E, V] (absent when tied to embed)
  layers: a tuple of L per-layer dicts (loaded models: run unrolled) or one dict stacked on a leading
          L axis (init_params, models under training: run by lax.scan). Per layer:
          attn_norm [E], wq [E, H, D], wk/wv [E, G, D], wo [H, D, E],
          (bq [H, D], bk/bv [G, D] with qkv_bias), mlp_norm [E], w_gate/w_up [E, F], w_down [F, E]
          (Gemma 3 adds q_norm/k_norm [D], post_attn_norm/post_mlp_norm [E])
Why two layouts: inside a compiled decode loop, scanning stacked weights makes XLA CPU copy each
layer's slice before use (measured: batch-1 SmolLM2 step 105 ms stacked vs 55 ms per-layer, with a
64-slot cache); per-layer arrays are read in place. Scanning keeps compile time low for training.
Shape letters as in DESIGN.md; R = H // G query heads per key/value head.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..cache import KVCache, advance, attention_mask, positions, write_layer
from ..config import ModelConfig
from ..flops import scan_unroll
from ..precision import einsum, project


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm (Zhang & Sennrich 2019) computed in float32: x / sqrt(mean(x^2) + eps) * weight."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * weight.astype(jnp.float32)).astype(x.dtype)


def rope_angles(pos: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos, sin [B, T, D/2] for integer positions pos[B, T] (Su et al. 2021, half-split layout)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    ang = pos.astype(jnp.float32)[..., None] * inv_freq
    return jnp.cos(ang), jnp.sin(ang)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate x [B, T, N, D] by angles [B, T, D/2]; pairs are (i, i + D/2) as in Hugging Face Llama."""
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)


def window_mask(pos: jax.Array, capacity: int, window: int) -> jax.Array:
    """bool[B, T, S]: the slots a sliding-window query at position pos[B, T] may see: the last
    `window` positions, itself included (slot s > p - window; a slot is its key's position)."""
    return jnp.arange(capacity, dtype=jnp.int32)[None, None, :] > pos[:, :, None] - window


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query attention. q [B, T, H, D], k/v [B, S, G, D], mask bool[B, T, S] -> [B, T, H, D]."""
    B, T, H, D = q.shape
    G = k.shape[2]
    q = q.reshape(B, T, G, H // G, D)
    scores = jnp.einsum("btgrd,bsgd->bgrts", q, k, preferred_element_type=jnp.float32) / jnp.sqrt(D)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bgrts,bsgd->btgrd", weights, v)
    return out.reshape(B, T, H, D)


def attend_live(q: jax.Array, k: jax.Array, v: jax.Array, pos: jax.Array, live: jax.Array,
                block: int = 64, window=0) -> jax.Array:
    """attend() with the causal mask of pos int32[B, T] over the first `live` slots only (traced
    int32: no query of interest sees past them), `block` slots at a time with a running softmax
    (Milakov & Gimelshein 2018, as in flash-decoding). The static cache has S slots; at batch 64 a
    decode step that reads all of them spends most of its time on empty ones. window > 0 (int, or
    traced): only the last `window` positions (window_mask), and blocks older than every query's
    window are skipped.
    q [B, T, H, D], k/v [B, S, G, D] -> [B, T, H, D]."""
    B, T, H, D = q.shape
    S, G = k.shape[1], k.shape[2]
    block = min(block, S)
    qg = q.reshape(B, T, G, H // G, D)
    low = jnp.finfo(jnp.float32).min

    def one_block(i, carry):
        m, l, acc = carry                                      # [B, G, R, T], [B, G, R, T], [B, G, R, T, D]
        start = jnp.minimum(i * block, S - block)             # the last block moves back to fit in S
        kb = jax.lax.dynamic_slice_in_dim(k, start, block, axis=1)
        vb = jax.lax.dynamic_slice_in_dim(v, start, block, axis=1)
        slot = start + jnp.arange(block, dtype=jnp.int32)
        seen = (slot[None, None, :] <= pos[:, :, None]) & (slot >= i * block)[None, None, :]   # [B, T, Sb]
        seen &= (window <= 0) | (slot[None, None, :] > pos[:, :, None] - window)
        s = jnp.einsum("btgrd,bsgd->bgrts", qg, kb, preferred_element_type=jnp.float32) / jnp.sqrt(D)
        s = jnp.where(seen[:, None, None], s, low)
        m_new = jnp.maximum(m, s.max(-1))
        w = jnp.where(seen[:, None, None], jnp.exp(s - m_new[..., None]), 0.0)
        scale = jnp.exp(m - m_new)
        acc = acc * scale[..., None] + jnp.einsum("bgrts,bsgd->bgrtd", w.astype(vb.dtype), vb,
                                                  preferred_element_type=jnp.float32)
        return m_new, l * scale + w.sum(-1), acc

    R = H // G
    carry = (jnp.full((B, G, R, T), low), jnp.zeros((B, G, R, T)), jnp.zeros((B, G, R, T, D)))
    blocks = jnp.clip((live + block - 1) // block, 1, -(-S // block))
    # blocks before `first` hold only keys older than every query's window
    first = jnp.where(window > 0, jnp.maximum(jnp.min(pos) - window + 1, 0) // block, 0)
    _, l, acc = jax.lax.fori_loop(jnp.minimum(first, blocks - 1), blocks, one_block, carry)
    out = (acc / jnp.where(l > 0, l, 1.0)[..., None]).astype(v.dtype)   # l = 0: a finished row past live
    return out.transpose(0, 3, 1, 2, 4).reshape(B, T, H, D)


def attention(cfg: ModelConfig, h, cache: KVCache, p, layer, pos, cos, sin, mask, live=None, window=0):
    """Self-attention of normalised h [B, T, E] (before the output projection's residual add): q/k/v,
    their norms (Gemma 3: q_norm, k_norm), RoPE, this layer's keys/values written into the cache,
    attention over the cache (mask, or attend_live). -> (out [B, T, E], cache)."""
    q = einsum("bte,ehd->bthd", h, p["wq"])
    k = einsum("bte,egd->btgd", h, p["wk"])
    v = einsum("bte,egd->btgd", h, p["wv"])
    if cfg.qkv_bias:
        q, k, v = q + p["bq"], k + p["bk"], v + p["bv"]
    if "q_norm" in p:
        q, k = rms_norm(q, p["q_norm"], cfg.rms_norm_eps), rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if abs(cfg.scale * cfg.head_dim ** 0.5 - 1.0) > 1e-12:     # attend() scales by 1 / sqrt(D)
        q = q * jnp.asarray(cfg.scale * cfg.head_dim ** 0.5, q.dtype)
    cache = write_layer(cache, layer, k, v, pos)
    if live is None:
        attn = attend(q, cache.k[layer], cache.v[layer], mask)
    else:
        attn = attend_live(q, cache.k[layer], cache.v[layer], pos, live, window=window)
    B, T, H, D = attn.shape            # contract (h, d) as one axis: XLA CPU runs the 2-axis einsum 4x slower
    return einsum("btk,ke->bte", attn.reshape(B, T, H * D), p["wo"].reshape(H * D, -1)), cache


def mlp(h, p, activation=jax.nn.silu):
    """The gated MLP of normalised h [B, T, E]: down(activation(gate h) * up h)."""
    gate = einsum("bte,ef->btf", h, p["w_gate"])
    up = einsum("bte,ef->btf", h, p["w_up"])
    return einsum("btf,fe->bte", activation(gate) * up, p["w_down"])


def _block(cfg: ModelConfig, x, cache: KVCache, p, layer, pos, cos, sin, mask, live=None, window=0):
    """One decoder layer on x [B, T, E]; writes this layer's keys/values into the cache. live: see
    forward_hidden."""
    out, cache = attention(cfg, rms_norm(x, p["attn_norm"], cfg.rms_norm_eps), cache, p, layer, pos, cos, sin,
                           mask, live, window)
    x = x + out
    return x + mlp(rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps), p), cache


def _layer_kinds(cfg: ModelConfig, rope_pos, mask, capacity: int) -> tuple:
    """(cos, sin, mask, window) of the global layers, and of the local (sliding-window) layers when
    the model has them (Gemma 3: their own RoPE base, and the window on top of the mask)."""
    glob = (*rope_angles(rope_pos, cfg.head_dim, cfg.rope_theta), mask, 0)
    if not cfg.local_layers:
        return (glob,)
    local = (*rope_angles(rope_pos, cfg.head_dim, cfg.rope_local_theta),
             mask & window_mask(rope_pos, capacity, cfg.sliding_window), cfg.sliding_window)
    return glob, local


def _kind_of(cfg: ModelConfig, kinds: tuple, layer):
    """Layer `layer`'s (cos, sin, mask, window): by its static index, or chosen by a traced one (scan)."""
    if len(kinds) == 1:
        return kinds[0]
    if isinstance(layer, int):
        return kinds[1] if layer in cfg.local_layers else kinds[0]
    local = jnp.asarray([i in cfg.local_layers for i in range(cfg.num_layers)])[layer]
    return tuple(jnp.where(local, b, a) for a, b in zip(*kinds))


def _block_of(cfg: ModelConfig):
    if cfg.gemma:
        from .gemma import gemma_block
        return gemma_block
    return _block


def forward_hidden(params, tokens: jax.Array, cache: KVCache, cfg: ModelConfig,
                   hidden_layers: tuple[int, ...] = (), live=None, tree=None):
    """Run T >= 1 new tokens per row through the decoder.

    tokens int32[B, T] are written at slots cache.length[b] + t. Returns
    (x [B, T, E] after the final norm, hidden [len(hidden_layers), B, T, E], cache with length += T).
    hidden_layers index the residual stream: 0 = embeddings, j = output of layer j (1..L).
    live (traced int32, optional): attention reads only the first `live` slots (attend_live); rows
    whose length + T exceeds it get wrong outputs, so pass the largest over the rows that matter.
    tree (optional): (RoPE positions int32[B, T], mask bool[B, T, S]) for a token tree's pass
    (jaxspec/tree.tree_inputs): the tokens are still written at slots length + t, but each sees only
    the slots the mask allows, at its depth's position. Not with live.
    """
    B, T = tokens.shape
    for j in hidden_layers:
        if not 0 <= j <= cfg.num_layers:
            raise ValueError(f"hidden layer {j} outside [0, {cfg.num_layers}]")
    pos = positions(cache, T)
    if tree is None:
        mask, rope_pos = attention_mask(pos, cache.capacity), pos
    elif live is not None:
        raise ValueError("a tree pass reads every slot (live must be None)")
    else:
        rope_pos, mask = tree
    kinds = _layer_kinds(cfg, rope_pos, mask, cache.capacity)
    x = params["embed"][tokens]
    if cfg.gemma:
        x = x * jnp.asarray(cfg.hidden_size ** 0.5, x.dtype)
    block = _block_of(cfg)
    collect = bool(hidden_layers)

    def step(carry, xs):
        x, cache = carry
        p, layer = xs
        cos, sin, mask, window = _kind_of(cfg, kinds, layer)
        x, cache = block(cfg, x, cache, p, layer, pos, cos, sin, mask, live, window)
        return (x, cache), (x if collect else None)

    layers = params["layers"]
    hidden = jnp.zeros((0, B, T, cfg.hidden_size), x.dtype)
    if isinstance(layers, dict):                                   # stacked: scan
        x0 = x
        (x, cache), per_layer = jax.lax.scan(step, (x, cache),
                                             (layers, jnp.arange(cfg.num_layers, dtype=jnp.int32)),
                                             unroll=scan_unroll())
        if collect:
            hidden = jnp.concatenate([x0[None], per_layer], axis=0)[jnp.asarray(hidden_layers)]
    else:                                                          # per-layer: unrolled
        stream = [x]                                               # residual stream, L+1 entries
        for i, p in enumerate(layers):
            (x, cache), _ = step((x, cache), (p, i))
            stream.append(x)
        if collect:
            hidden = jnp.stack([stream[j] for j in hidden_layers])
    x = rms_norm(x, params["norm"], cfg.rms_norm_eps)
    return x, hidden, advance(cache, T)


def unstack_layers(layers) -> tuple:
    """Stacked layers (a dict of [L, ...] arrays) -> a tuple of L per-layer dicts; tuples pass through."""
    if not isinstance(layers, dict):
        return tuple(layers)
    n = len(next(iter(layers.values())))
    return tuple({k: v[i] for k, v in layers.items()} for i in range(n))


def stack_layers(layers) -> dict:
    """A tuple of per-layer dicts -> one dict of [L, ...] arrays; stacked dicts pass through."""
    if isinstance(layers, dict):
        return layers
    return {k: jnp.stack([p[k] for p in layers]) for k in layers[0]}


def layer_params(params, i: int) -> dict:
    """Layer i's weights (a dict of per-layer arrays) in either layout."""
    layers = params["layers"]
    return {k: v[i] for k, v in layers.items()} if isinstance(layers, dict) else layers[i]


def lm_head(params, x: jax.Array) -> jax.Array:
    """Logits float32[..., V] from normalised features x [..., E] (tied to embed when no lm_head)."""
    if "lm_head" in params:
        return project(x, params["lm_head"])
    return project(x, params["embed"], "ne,ve->nv")


def lm_head_rows(params, ids: jax.Array) -> jax.Array:
    """The output matrix restricted to token ids int32[n] (a draft vocabulary): [E, n]."""
    if "lm_head" in params:
        return params["lm_head"][:, ids]
    return params["embed"][ids].T


def forward(params, tokens: jax.Array, cache: KVCache, cfg: ModelConfig,
            hidden_layers: tuple[int, ...] = (), live=None, tree=None):
    """forward(params, tokens[B,T], cache) -> (logits float32[B,T,V], hidden [N,B,T,E], cache)."""
    x, hidden, cache = forward_hidden(params, tokens, cache, cfg, hidden_layers, live, tree)
    return lm_head(params, x), hidden, cache


def init_params(cfg: ModelConfig, key: jax.Array, dtype=jnp.float32, scale: float = 0.02):
    """Random-init params (normal(0, scale) matrices, unit norms) for tests and small draft models."""
    E, F, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_layers
    H, G, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    shapes = {"wq": (L, E, H, D), "wk": (L, E, G, D), "wv": (L, E, G, D), "wo": (L, H, D, E),
              "w_gate": (L, E, F), "w_up": (L, E, F), "w_down": (L, F, E)}
    if cfg.qkv_bias:
        shapes.update(bq=(L, H, D), bk=(L, G, D), bv=(L, G, D))
    keys = jax.random.split(key, len(shapes) + 2)
    layers = {name: (scale * jax.random.normal(k, shape)).astype(dtype)
              for k, (name, shape) in zip(keys, shapes.items())}
    layers["attn_norm"] = jnp.ones((L, E), dtype)
    layers["mlp_norm"] = jnp.ones((L, E), dtype)
    if cfg.gemma:
        layers.update(q_norm=jnp.ones((L, D), dtype), k_norm=jnp.ones((L, D), dtype),
                      post_attn_norm=jnp.ones((L, E), dtype), post_mlp_norm=jnp.ones((L, E), dtype))
    params = {"embed": (scale * jax.random.normal(keys[-2], (V, E))).astype(dtype),
              "norm": jnp.ones((E,), dtype), "layers": layers}
    if not cfg.tie_word_embeddings:
        params["lm_head"] = (scale * jax.random.normal(keys[-1], (E, V))).astype(dtype)
    return params
