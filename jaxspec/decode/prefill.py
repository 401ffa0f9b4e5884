"""The prompts' pass: its own compiled program, so the time to the first token and the decode loop
are timed apart."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ..cache import KVCache, rollback
from ..config import ModelConfig
from ..models import forward_hidden, lm_head
from ..sampling import sample_tokens
from .programs import TRACES


def prefill(params, tokens, lengths, cache: KVCache, sampling, key, *, cfg: ModelConfig, hidden_layers=()):
    """Run the padded prompts tokens int32[B, T]; sample the first new token from each row's last real
    position. -> (first int32[B], cache, hidden [N, B, T, E] of the requested layers, the loop's key)."""
    TRACES["prefill"] += 1
    key, sub = jax.random.split(key)
    x, hidden, cache = forward_hidden(params, tokens, cache, cfg, hidden_layers)
    cache = rollback(cache, lengths)
    last = jnp.take_along_axis(x, (lengths - 1)[:, None, None], axis=1)[:, 0]  # [B, E]
    return sample_tokens(sub, lm_head(params, last), sampling), cache, hidden, key
