"""EAGLE-3-style draft head (Li et al. 2025, "EAGLE-3"; EAGLE, Li et al. 2024).

Target hidden states from a low, a middle and a high layer are fused by one linear map
(fc: [N, E, E]). One decoder layer reads, at position t, the pair (feature_t, token_{t+1}):
its attention input joins RMSNorm(embedding of token_{t+1}) and RMSNorm(feature_t) ([B, T, 2E]);
its residual stream starts from feature_t. Its output h_t predicts token_{t+2} through a
reduced draft vocabulary (Vd most frequent target tokens, d2t maps draft -> target ids).
When drafting further, h_t replaces the target feature. The target's embeddings are frozen and
shared, never copied into the head.

Params: fc [N, E, E]; embed_norm, feature_norm [E]; wq [2E, H, D], wk/wv [2E, G, D], wo [H, D, E];
mlp_norm [E]; w_gate/w_up [E, F], w_down [F, E]; norm [E]; lm_head [E, Vd]; d2t int32[Vd].
With tied_head the output rows are not the head's: they are the target's own rows of the draft
vocabulary, frozen (as EAGLE-1 reuses the target's LM head), so a large Vd costs no stored weights.

EagleHead (Flax NNX) owns them: nnx.Param for the trained arrays, DraftVocab for d2t. The drafter and
the training step carry its state through nnx.split / nnx.merge; the math is the pure functions
below, over the mapping EagleHead.arrays() gives.
"""
from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from ..cache import KVCache, advance, attention_mask, positions, write_layer
from ..config import ModelConfig
from ..precision import einsum, project
from ..models.llama import apply_rope, attend, lm_head_rows, rms_norm, rope_angles


@dataclasses.dataclass(frozen=True)
class EagleConfig:
    hidden_size: int            # E (the target's)
    intermediate_size: int      # F
    num_heads: int              # H
    num_kv_heads: int           # G
    head_dim: int               # D
    rope_theta: float
    rms_norm_eps: float
    target_vocab_size: int      # V
    draft_vocab_size: int       # Vd
    feature_layers: tuple       # target hidden-stream indices fused (low, middle, high)
    tied_head: bool = False     # output rows: the target's frozen rows of the draft vocabulary

    @classmethod
    def for_target(cls, target: ModelConfig, draft_vocab_size: int, feature_layers=None,
                   tied_head: bool = False) -> "EagleConfig":
        L = target.num_layers
        layers = tuple(feature_layers) if feature_layers else (2, L // 2, L - 2)
        if not all(0 <= j <= L for j in layers):
            raise ValueError(f"feature_layers {layers} outside [0, {L}]")
        if not 1 <= draft_vocab_size <= target.vocab_size:
            raise ValueError(f"draft_vocab_size must lie in [1, {target.vocab_size}], got {draft_vocab_size}")
        return cls(target.hidden_size, target.intermediate_size, target.num_heads, target.num_kv_heads,
                   target.head_dim, target.rope_theta, target.rms_norm_eps, target.vocab_size,
                   int(draft_vocab_size), layers, bool(tied_head))

    def cache_config(self) -> ModelConfig:
        """The one-layer shape of the head's KV cache."""
        return ModelConfig(vocab_size=self.target_vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_layers=1, num_heads=self.num_heads,
                           num_kv_heads=self.num_kv_heads, head_dim=self.head_dim)


def init_eagle_params(cfg: EagleConfig, key: jax.Array, d2t=None, lm_head=None, dtype=jnp.float32,
                      scale: float = 0.02) -> dict:
    """Random init; the fuse map starts as exactly the mean of the features (noise there would swamp the
    target's state: on Gemma 3, whose final norm scales some channels by up to 300, noise of 0.02 gave
    a first loss of 115 nats a step against 5.6 for the plain mean), lm_head may start from the
    target's rows for the draft vocabulary (lm_head [E, Vd])."""
    E, F, H, G, D, Vd = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                         cfg.head_dim, cfg.draft_vocab_size)
    N = len(cfg.feature_layers)
    ks = jax.random.split(key, 8)
    normal = lambda k, shape: (scale * jax.random.normal(k, shape)).astype(dtype)
    params = {
        "fc": jnp.broadcast_to(jnp.eye(E) / N, (N, E, E)).astype(dtype),
        "embed_norm": jnp.ones((E,), dtype), "feature_norm": jnp.ones((E,), dtype),
        "wq": normal(ks[1], (2 * E, H, D)), "wk": normal(ks[2], (2 * E, G, D)), "wv": normal(ks[3], (2 * E, G, D)),
        "wo": normal(ks[4], (H, D, E)), "mlp_norm": jnp.ones((E,), dtype),
        "w_gate": normal(ks[5], (E, F)), "w_up": normal(ks[6], (E, F)), "w_down": normal(ks[7], (F, E)),
        "norm": jnp.ones((E,), dtype),
        "d2t": jnp.arange(Vd, dtype=jnp.int32) if d2t is None else jnp.asarray(d2t, jnp.int32),
    }
    if not cfg.tied_head:
        params["lm_head"] = (normal(jax.random.fold_in(key, 9), (E, Vd)) if lm_head is None
                             else jnp.array(lm_head, dtype))          # a copy: training donates it
    return params


class DraftVocab(nnx.Variable):
    """d2t int32[Vd]: the target id of each draft-vocabulary row (chosen from data, not trained)."""


def param_shapes(cfg: EagleConfig) -> dict:
    """The shape of each trained array (lm_head only when the head has its own)."""
    E, F, H, G, D, Vd = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                         cfg.head_dim, cfg.draft_vocab_size)
    own_rows = {} if cfg.tied_head else {"lm_head": (E, Vd)}
    return {"fc": (len(cfg.feature_layers), E, E), "embed_norm": (E,), "feature_norm": (E,), "wq": (2 * E, H, D),
            "wk": (2 * E, G, D), "wv": (2 * E, G, D), "wo": (H, D, E), "mlp_norm": (E,), "w_gate": (E, F),
            "w_up": (E, F), "w_down": (F, E), "norm": (E,), **own_rows}


class EagleHead(nnx.Module):
    """The EAGLE head's state: EagleHead(cfg, arrays) from a mapping of the arrays in the module
    docstring (init_eagle_params, or a saved head); EagleHead.init(cfg, rngs=...) at random."""

    def __init__(self, cfg: EagleConfig, arrays: dict):
        self.cfg = cfg
        shapes = param_shapes(cfg)
        missing = sorted((set(shapes) | {"d2t"}) - set(arrays))
        if missing:
            raise ValueError(f"EAGLE head arrays lack {missing}")
        try:
            chex.assert_trees_all_equal_shapes(
                {k: jnp.asarray(arrays[k]) for k in shapes}, {k: jnp.zeros(v, jnp.int8) for k, v in shapes.items()})
            chex.assert_shape(arrays["d2t"], (cfg.draft_vocab_size,))
        except AssertionError as e:
            raise ValueError(f"EAGLE head arrays do not fit {cfg}: {e}") from None
        for name in shapes:
            setattr(self, name, nnx.Param(jnp.asarray(arrays[name])))
        self.d2t = DraftVocab(jnp.asarray(arrays["d2t"], jnp.int32))

    @classmethod
    def init(cls, cfg: EagleConfig, *, rngs: nnx.Rngs, d2t=None, lm_head=None, dtype=jnp.float32,
             scale: float = 0.02) -> "EagleHead":
        return cls(cfg, init_eagle_params(cfg, rngs.params(), d2t, lm_head, dtype, scale))

    def arrays(self) -> dict:
        """{name: array} of every parameter and d2t (what the files hold)."""
        return {**{name: getattr(self, name)[...] for name in param_shapes(self.cfg)}, "d2t": self.d2t[...]}

    def output_rows(self, target) -> jax.Array:
        """[E, Vd]: the head's own lm_head, or (tied_head) the rows of the target's output matrix
        for the draft vocabulary. target: the target's params, or those rows already taken."""
        if not self.cfg.tied_head:
            return self.lm_head[...]
        return target if isinstance(target, jax.Array) else lm_head_rows(target, self.d2t[...])

    def _with(self, rows) -> dict:
        return {**self.arrays(), "lm_head": rows}

    def fuse(self, feats: jax.Array) -> jax.Array:
        return fuse_features(self.arrays(), feats)

    def qkv(self, embed, feature, tokens, pos):
        return eagle_qkv(self.arrays(), embed, feature, tokens, pos, self.cfg)

    def hidden(self, feature, attn):
        """The head's output state h [B, T, E] (eagle_hidden)."""
        return eagle_hidden(self.arrays(), feature, attn, self.cfg)

    def logits(self, h, rows):
        """h [..., E] -> draft logits float32[..., Vd] through rows [E, Vd] (output_rows(...))."""
        return project(rms_norm(h, self.norm[...], self.cfg.rms_norm_eps), rows)

    def step(self, embed, feature, tokens, cache: KVCache, rows, tree=None):
        return eagle_step(self._with(rows), embed, feature, tokens, cache, self.cfg, tree)

    def target_logits(self, draft_logits: jax.Array) -> jax.Array:
        return to_target_logits(self.arrays(), draft_logits, self.cfg.target_vocab_size)


def fuse_features(params, feats: jax.Array) -> jax.Array:
    """Target features [N, B, T, E] (low, mid, high) -> one feature [B, T, E]."""
    return einsum("nbte,nef->btf", feats.astype(params["fc"].dtype), params["fc"])


def eagle_qkv(params, embed: jax.Array, feature: jax.Array, tokens: jax.Array, pos: jax.Array,
              cfg: EagleConfig):
    """Attention inputs for pairs (feature [B, T, E], tokens [B, T]) at positions pos [B, T]:
    q [B, T, H, D] and k, v [B, T, G, D], RoPE applied."""
    cos, sin = rope_angles(pos, cfg.head_dim, cfg.rope_theta)
    e = rms_norm(embed[tokens].astype(feature.dtype), params["embed_norm"], cfg.rms_norm_eps)
    f = rms_norm(feature, params["feature_norm"], cfg.rms_norm_eps)
    x = jnp.concatenate([e, f], axis=-1)                                   # [B, T, 2E]
    q = apply_rope(einsum("btc,chd->bthd", x, params["wq"]), cos, sin)
    k = apply_rope(einsum("btc,cgd->btgd", x, params["wk"]), cos, sin)
    return q, k, einsum("btc,cgd->btgd", x, params["wv"])


def eagle_hidden(params, feature: jax.Array, attn: jax.Array, cfg: EagleConfig) -> jax.Array:
    """Residual from the feature [B, T, E], attention output attn [B, T, H, D], MLP -> h [B, T, E]."""
    B, T, H, D = attn.shape            # (h, d) contracted as one axis: XLA CPU runs the 2-axis einsum slower
    h = feature + einsum("btk,ke->bte", attn.reshape(B, T, H * D), params["wo"].reshape(H * D, -1))
    m = rms_norm(h, params["mlp_norm"], cfg.rms_norm_eps)
    gate, up = einsum("bte,ef->btf", m, params["w_gate"]), einsum("bte,ef->btf", m, params["w_up"])
    return h + einsum("btf,fe->bte", jax.nn.silu(gate) * up, params["w_down"])


def eagle_out(params, feature: jax.Array, attn: jax.Array, cfg: EagleConfig):
    """eagle_hidden and its draft logits through params["lm_head"] -> (h [B, T, E], logits float32[B, T, Vd])."""
    h = eagle_hidden(params, feature, attn, cfg)
    return h, project(rms_norm(h, params["norm"], cfg.rms_norm_eps), params["lm_head"])


def eagle_step(params, embed: jax.Array, feature: jax.Array, tokens: jax.Array, cache: KVCache,
               cfg: EagleConfig, tree=None):
    """Pairs (feature[B, T, E], tokens int32[B, T]) written at each row's cache length ->
    (h [B, T, E], draft logits float32[B, T, Vd], cache with length += T). embed: the target's [V, E].
    tree (optional): (RoPE positions int32[B, T], mask bool[B, T, S]) for tree nodes (tree.frontier_inputs)."""
    pos = positions(cache, tokens.shape[1])
    rope, mask = (pos, attention_mask(pos, cache.capacity)) if tree is None else tree
    q, k, v = eagle_qkv(params, embed, feature, tokens, rope, cfg)
    cache = write_layer(cache, 0, k, v, pos)
    attn = attend(q, cache.k[0], cache.v[0], mask)
    h, logits = eagle_out(params, feature, attn, cfg)
    return h, logits, advance(cache, tokens.shape[1])


def to_target_logits(params, draft_logits: jax.Array, vocab_size: int) -> jax.Array:
    """Draft-vocabulary logits [..., Vd] -> target-vocabulary logits [..., V] (-inf off the draft vocab).

    A gather through the inverse map t2d int32[V] (Vd, out of range, off the draft vocab), not a
    scatter of the logits into [..., V]: inside the sharded decode loop on 8-device meshes with the
    vocabulary over 4 or 8 "model" devices, XLA partitioned that scatter so that sampled drafts came
    out different from one device's (greedy argmaxes unchanged)."""
    d2t = params["d2t"]
    Vd = d2t.shape[0]
    t2d = jnp.full((vocab_size,), Vd, jnp.int32).at[d2t].set(jnp.arange(Vd, dtype=jnp.int32))
    return jnp.take(draft_logits.astype(jnp.float32), t2d, axis=-1, mode="fill", fill_value=-jnp.inf)
