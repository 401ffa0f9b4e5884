"""Logits -> the probabilities actually sampled from: per-row temperature, top-k, top-p, min-p.

Draft and target go through the same function, so rejection sampling reproduces exactly the
distribution a plain sampler would draw from. Temperature 0 means greedy: a one-hot on the argmax.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Sampling:
    """temperature >= 0 (0 = greedy); top_k >= 0 (0 = off); top_p in (0, 1]; min_p in [0, 1]."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self):
        t, k, p, m = self.temperature, self.top_k, self.top_p, self.min_p
        if not np.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t}")
        if int(k) != k or k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 disables it), got {k}")
        if not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {p}")
        if not 0.0 <= m <= 1.0:
            raise ValueError(f"min_p must lie in [0, 1], got {m}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


SamplingArg = Union[Sampling, Sequence[Sampling]]


def row_params(sampling: SamplingArg, batch: int) -> dict[str, jax.Array]:
    """One Sampling for all rows, or one per row -> arrays [B] (dynamic: no recompilation)."""
    rows = [sampling] * batch if isinstance(sampling, Sampling) else list(sampling)
    if len(rows) != batch or not all(isinstance(s, Sampling) for s in rows):
        raise ValueError(f"sampling must be a Sampling or a list of {batch} Sampling, one per prompt")
    return {"temperature": jnp.asarray([s.temperature for s in rows], jnp.float32),
            "top_k": jnp.asarray([s.top_k for s in rows], jnp.int32),
            "top_p": jnp.asarray([s.top_p for s in rows], jnp.float32),
            "min_p": jnp.asarray([s.min_p for s in rows], jnp.float32)}


def _filtered_probs(logits: jax.Array, params: dict[str, jax.Array]) -> jax.Array:
    """Temperature, then top-k, then top-p on the renormalised top-k mass, then min-p."""
    V = logits.shape[-1]
    lead = (1,) * (logits.ndim - 1)
    expand = lambda a: a.reshape(a.shape + lead)  # [B] -> [B, 1, ..., 1]
    temperature = expand(params["temperature"])
    scaled = logits / jnp.where(temperature > 0, temperature, 1.0)
    desc = -jnp.sort(-scaled, axis=-1)                      # [..., V] largest first
    rank = jnp.arange(V, dtype=jnp.int32)
    top_k = expand(params["top_k"])
    keep = (top_k <= 0) | (rank < top_k)
    p_desc = jax.nn.softmax(jnp.where(keep, desc, -jnp.inf), axis=-1)
    keep &= (jnp.cumsum(p_desc, axis=-1) - p_desc) < expand(params["top_p"])
    keep &= p_desc >= expand(params["min_p"]) * p_desc[..., :1]
    # every filter keeps a prefix of the sorted order: the cutoff is the last kept value
    last = jnp.sum(keep, axis=-1, keepdims=True) - 1
    cutoff = jnp.take_along_axis(desc, last, axis=-1)
    return jax.nn.softmax(jnp.where(scaled >= cutoff, scaled, -jnp.inf), axis=-1)


def probs_from_logits(logits: jax.Array, params: dict[str, jax.Array]) -> jax.Array:
    """logits [B, ..., V] + per-row params [B] -> float32 probabilities [B, ..., V] (greedy rows one-hot)."""
    logits = logits.astype(jnp.float32)
    V = logits.shape[-1]
    onehot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), V, dtype=jnp.float32)
    greedy = (params["temperature"] == 0).reshape((-1,) + (1,) * (logits.ndim - 1))
    sampled = jax.lax.cond(jnp.all(params["temperature"] == 0),
                           lambda: onehot, lambda: _filtered_probs(logits, params))
    return jnp.where(greedy, onehot, sampled)


def sample_tokens(key: jax.Array, logits: jax.Array, params: dict[str, jax.Array]) -> jax.Array:
    """Draw one token per position: logits [B, ..., V] -> int32[B, ...] (argmax for greedy rows)."""
    def draw():
        probs = probs_from_logits(logits, params)
        drawn = jax.random.categorical(key, jnp.log(probs), axis=-1).astype(jnp.int32)
        greedy = (params["temperature"] == 0).reshape((-1,) + (1,) * (logits.ndim - 2))
        return jnp.where(greedy, jnp.argmax(logits, axis=-1).astype(jnp.int32), drawn)

    return jax.lax.cond(jnp.all(params["temperature"] == 0),
                        lambda: jnp.argmax(logits, axis=-1).astype(jnp.int32), draw)
