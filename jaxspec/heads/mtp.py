"""Multi-token-prediction heads (DeepSeek-V3, DeepSeek-AI 2024, section 2.2).

D sequential modules. Module j (1..D) at position p joins RMSNorm(h^{j-1}_p) and
RMSNorm(embedding of token_{p+j}) through a linear map M_j [2E, E], runs one transformer block
(the target's layer shape, causal over p) and gives h^j_p, which predicts token_{p+j+1} through the
target's frozen final norm and output head (rows of a draft vocabulary Vd, d2t: draft -> target ids).
h^0_p is the target's last hidden state (before its final norm), which predicts token_{p+1}.

Params, stacked over modules: h_norm, e_norm [D, E]; proj [D, 2E, E]; block [D, ...] with the keys of
a target layer (attn_norm, wq [E, H, Dh], wk/wv [E, G, Dh], wo, mlp_norm, w_gate, w_up, w_down);
d2t int32[Vd]. The modules' KV caches are one KVCache with a layer per module.

MTPHead (Flax NNX) owns them, one MTPModule per module (arrays kept apart: inside a compiled step
XLA CPU copied the slices of stacked module weights whenever two parts of the step, the drafter's
catch-up loop and its window, read them, 7 of a 14 ms MTP propose) and DraftVocab for d2t; the drafter and the training step carry its state through
nnx.split / nnx.merge, and the math is the pure functions below.
"""
from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from ..cache import KVCache, advance, attention_mask, positions, rollback
from ..config import ModelConfig
from ..precision import einsum, project
from ..models.llama import _block, rms_norm, rope_angles
from .eagle import DraftVocab

BLOCK_KEYS = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")


@dataclasses.dataclass(frozen=True)
class MTPConfig:
    hidden_size: int            # E (the target's)
    intermediate_size: int      # F
    num_heads: int              # H
    num_kv_heads: int           # G
    head_dim: int               # Dh
    rope_theta: float
    rms_norm_eps: float
    target_vocab_size: int      # V
    draft_vocab_size: int       # Vd
    num_modules: int            # D
    target_layers: int          # L: h^0 is the target's residual stream after its last layer

    @classmethod
    def for_target(cls, target: ModelConfig, num_modules: int, draft_vocab_size: int) -> "MTPConfig":
        if not 1 <= num_modules <= 8:
            raise ValueError(f"num_modules must lie in [1, 8], got {num_modules}")
        if not 1 <= draft_vocab_size <= target.vocab_size:
            raise ValueError(f"draft_vocab_size must lie in [1, {target.vocab_size}], got {draft_vocab_size}")
        return cls(target.hidden_size, target.intermediate_size, target.num_heads, target.num_kv_heads,
                   target.head_dim, target.rope_theta, target.rms_norm_eps, target.vocab_size,
                   int(draft_vocab_size), int(num_modules), target.num_layers)

    def cache_config(self) -> ModelConfig:
        """The modules' blocks as a ModelConfig (one KV-cache layer per module)."""
        return ModelConfig(vocab_size=self.target_vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_layers=self.num_modules,
                           num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
                           rope_theta=self.rope_theta, rms_norm_eps=self.rms_norm_eps)


def init_mtp_params(cfg: MTPConfig, key: jax.Array, d2t=None, block=None, dtype=jnp.float32,
                    scale: float = 0.02) -> dict:
    """Random init. proj starts as exactly [I; 0] (h^j starts at h^{j-1}; no noise, as the EAGLE head's fuse
    map: init_eagle_params); block, if given, is one
    target layer's weights (dict of BLOCK_KEYS) copied into every module."""
    E, F, H, G, Dh, D = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                         cfg.head_dim, cfg.num_modules)
    ks = jax.random.split(key, 8)
    normal = lambda k, shape: (scale * jax.random.normal(k, shape)).astype(dtype)
    eye = jnp.concatenate([jnp.eye(E), jnp.zeros((E, E))], axis=0)                  # [2E, E]
    if block is None:
        block = {"attn_norm": jnp.ones((E,)), "wq": normal(ks[1], (E, H, Dh)), "wk": normal(ks[2], (E, G, Dh)),
                 "wv": normal(ks[3], (E, G, Dh)), "wo": normal(ks[4], (H, Dh, E)), "mlp_norm": jnp.ones((E,)),
                 "w_gate": normal(ks[5], (E, F)), "w_up": normal(ks[6], (E, F)), "w_down": normal(ks[7], (F, E))}
    stack = lambda a: jnp.array(jnp.broadcast_to(jnp.asarray(a, dtype), (D,) + jnp.shape(a)))   # a copy
    return {
        "h_norm": jnp.ones((D, E), dtype), "e_norm": jnp.ones((D, E), dtype),
        "proj": jnp.broadcast_to(eye, (D, 2 * E, E)).astype(dtype),
        "block": {k: stack(block[k]) for k in BLOCK_KEYS},
        "d2t": (jnp.arange(cfg.draft_vocab_size, dtype=jnp.int32) if d2t is None
                else jnp.asarray(d2t, jnp.int32)),
    }


MODULE_KEYS = ("h_norm", "e_norm", "proj", "block")


class MTPModule(nnx.Module):
    """One module's arrays: h_norm, e_norm [E], proj [2E, E], block {BLOCK_KEYS: a target layer's shapes}."""

    def __init__(self, arrays: dict):
        self.h_norm, self.e_norm, self.proj = (nnx.Param(jnp.asarray(arrays[k])) for k in ("h_norm", "e_norm", "proj"))
        self.block = nnx.Dict({k: nnx.Param(jnp.asarray(arrays["block"][k])) for k in BLOCK_KEYS})

    def arrays(self) -> dict:
        return {"h_norm": self.h_norm[...], "e_norm": self.e_norm[...], "proj": self.proj[...],
                "block": {k: self.block[k][...] for k in BLOCK_KEYS}}


class MTPHead(nnx.Module):
    """The MTP head's state: MTPHead(cfg, arrays) from the stacked arrays of the module docstring
    (init_mtp_params, or a saved head); MTPHead.init(cfg, rngs=...) at random."""

    def __init__(self, cfg: MTPConfig, arrays: dict):
        self.cfg = cfg
        like = init_mtp_params(cfg, jax.random.PRNGKey(0), dtype=jnp.int8)      # the shapes the config asks for
        try:
            chex.assert_trees_all_equal_shapes({k: arrays[k] for k in like}, like)
        except (AssertionError, KeyError, ValueError) as e:
            raise ValueError(f"MTP head arrays do not fit {cfg}: {e}") from None
        self.modules = nnx.List([MTPModule(module_at(arrays, j)) for j in range(cfg.num_modules)])
        self.d2t = DraftVocab(jnp.asarray(arrays["d2t"], jnp.int32))

    @classmethod
    def init(cls, cfg: MTPConfig, *, rngs: nnx.Rngs, d2t=None, block=None, dtype=jnp.float32,
             scale: float = 0.02) -> "MTPHead":
        return cls(cfg, init_mtp_params(cfg, rngs.params(), d2t, block, dtype, scale))

    def arrays(self) -> dict:
        """{"modules": per-module arrays, "d2t"}: what mtp_module and mtp_window take."""
        return {"modules": tuple(m.arrays() for m in self.modules), "d2t": self.d2t[...]}

    def stacked(self) -> dict:
        """The arrays stacked over modules, as init_mtp_params gives them and files hold them."""
        mods = [m.arrays() for m in self.modules]
        return {**jax.tree_util.tree_map(lambda *a: jnp.stack(a), *mods), "d2t": self.d2t[...]}


def module_at(params, j: int) -> dict:
    """Module j's own parameters (0-based): params["modules"][j] when they are kept apart (MTPHead.arrays),
    else a slice of the stacked arrays."""
    if "modules" in params:
        return params["modules"][j]
    return jax.tree_util.tree_map(lambda a: a[j], {k: params[k] for k in MODULE_KEYS})


def mtp_module(params, j: int, embed: jax.Array, h_prev: jax.Array, tokens: jax.Array, cache: KVCache,
               cfg: MTPConfig):
    """Module j + 1 (j 0-based) at positions p = cache.length + t: h_prev [B, T, E] is h^j_p, tokens
    int32[B, T] are token_{p+j+1}. -> (h^{j+1} [B, T, E], cache with layer j written, length unchanged)."""
    m, mcfg = module_at(params, j), cfg.cache_config()
    e = rms_norm(embed[tokens].astype(h_prev.dtype), m["e_norm"], cfg.rms_norm_eps)
    x = einsum("btc,ce->bte", jnp.concatenate([rms_norm(h_prev, m["h_norm"], cfg.rms_norm_eps), e], -1), m["proj"])
    pos = positions(cache, tokens.shape[1])
    cos, sin = rope_angles(pos, cfg.head_dim, cfg.rope_theta)
    x, cache = _block(mcfg, x, cache, m["block"], j, pos, cos, sin, attention_mask(pos, cache.capacity))
    return x, cache


def mtp_logits(norm: jax.Array, rows: jax.Array, h: jax.Array, eps: float) -> jax.Array:
    """h [..., E] -> draft-vocabulary logits float32[..., Vd] through the target's final norm [E] and
    its output rows of the draft vocabulary [E, Vd]."""
    return project(rms_norm(h, norm, eps), rows)


def mtp_window(params, embed: jax.Array, h0: jax.Array, next_tokens: jax.Array, cache: KVCache, cfg: MTPConfig,
               start: jax.Array):
    """All D modules over a window of T positions p = start[b] + t (teacher forcing).

    h0 [B, T, E]: the target's last hidden state there; next_tokens int32[B, T + D - 1]: token_{p+1} at
    column t, continuing D - 1 columns further (module j reads columns j-1 .. j-1+T).
    -> (h [D, B, T, E], cache holding the window in each module's layer, length = start + T)."""
    T = h0.shape[1]
    hs, h = [], h0
    for j in range(cfg.num_modules):
        h, cache = mtp_module(params, j, embed, h, next_tokens[:, j:j + T], rollback(cache, start), cfg)
        hs.append(h)
    return jnp.stack(hs), advance(rollback(cache, start), T)
