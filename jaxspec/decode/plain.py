"""Plain autoregressive decoding: one lax.while_loop of one-token target steps."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from .. import rowwise, streaming
from ..cache import KVCache
from ..models import forward
from ..sampling import sample_tokens
from .batch import live_slots
from .programs import TRACES


class PlainState(NamedTuple):
    cache: KVCache       # the target's KV cache, length = tokens in it per row
    last: jax.Array      # int32[B]: newest token, not yet in the cache
    out: jax.Array       # int32[B, N]: new tokens per row (-1 where none)
    count: jax.Array     # int32[B]: new tokens so far
    done: jax.Array      # bool[B]: rows finished (EOS or their limit)
    key: jax.Array       # PRNG key
    steps: jax.Array     # int32: target steps so far


def autoregressive(params, first, limits, cache, sampling, eos_ids, key, max_steps, stream_id, *, cfg, capacity_out,
                   live_attention, stream=False):
    """Steps after prefill (first int32[B], the cache holding the prompts) until every row is done, or
    max_steps (int32; costs.py times plain steps with this same program). stream (static): each step
    sends its token to the host stream stream_id (jaxspec/streaming.py).
    live_attention (static): attention reads only the slots of the longest unfinished row.
    -> (out int32[B, N], count int32[B], steps, cache)."""
    TRACES["autoregressive"] += 1
    B = first.shape[0]

    def body(s: PlainState) -> PlainState:
        key, sub = jax.random.split(s.key)
        logits, _, cache = forward(params, s.last[:, None], s.cache, cfg, live=live_slots(s.cache, s.done, 1,
                                                                                            live_attention))
        tok = sample_tokens(sub, logits[:, 0], sampling)
        if stream:
            streaming.send(stream_id, s.steps, tok[:, None], (~s.done).astype(jnp.int32))
        slot = jnp.where(s.done, capacity_out, s.count)               # finished rows write nowhere
        count = s.count + (~s.done).astype(jnp.int32)
        return PlainState(cache=cache, last=jnp.where(s.done, s.last, tok),
                          out=rowwise.scatter(s.out, slot, tok), count=count,
                          done=s.done | jnp.isin(tok, eos_ids) | (count >= limits), key=key, steps=s.steps + 1)

    count = jnp.ones((B,), jnp.int32)
    state = PlainState(cache=cache, last=first, out=jnp.full((B, capacity_out), -1, jnp.int32).at[:, 0].set(first),
                       count=count, done=jnp.isin(first, eos_ids) | (count >= limits), key=key,
                       steps=jnp.zeros((), jnp.int32))
    s = jax.lax.while_loop(lambda s: ~jnp.all(s.done) & (s.steps < max_steps), body, state)
    return s.out, s.count, s.steps, s.cache  # returning the cache lets XLA reuse the donated buffers
