"""Generation loops: one compiled program per (shape bucket), prefill + lax.while_loop.

Prompts are right-padded to a power-of-two bucket; padded slots lie beyond each row's length,
so they are masked and later overwritten. Rows stop independently at EOS or their own limit.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import time
from typing import Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from .cache import KVCache, init_cache, rollback
from .config import ModelConfig
from .models import forward, forward_hidden, lm_head
from .sampling import Sampling, SamplingArg, row_params, sample_tokens

TRACES: collections.Counter = collections.Counter()  # program name -> times traced (compile guard)
_COMPILED: dict = {}


@dataclasses.dataclass
class Stats:
    wall_seconds: float
    tokens_per_second: float
    compile_seconds: float
    new_tokens: int
    target_steps: int                      # target forward passes after prefill, summed over the loop
    mean_accepted_length: float = 1.0      # 1 + accepted / steps (counts the bonus token)
    acceptance_rate: Optional[float] = None
    per_position_acceptance: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class GenerateOutput:
    tokens: list          # list[list[int]]: new tokens per row, EOS kept when produced
    texts: list           # decoded, special tokens skipped
    stats: Stats


def bucket(n: int, minimum: int = 16) -> int:
    """Next power of two >= n (at least `minimum`): shapes that repeat, so programs are reused."""
    return max(minimum, 1 << (max(n, 1) - 1).bit_length())


def _check_prompts(prompts, vocab_size: int) -> list[list[int]]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    rows = []
    for i, p in enumerate(prompts):
        ids = np.asarray(p).reshape(-1) if not isinstance(p, (str, bytes)) else None
        if ids is not None and ids.size == 0:
            raise ValueError(f"prompt {i} is empty: generation needs at least one token")
        if ids is None or ids.dtype.kind not in "iu":
            raise ValueError(f"prompt {i} must be a list of token ids (use model.tokenizer to encode text)")
        if ids.min() < 0 or ids.max() >= vocab_size:
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab_size})")
        rows.append([int(t) for t in ids])
    return rows


def _check_limits(max_new_tokens, batch: int) -> np.ndarray:
    limits = np.broadcast_to(np.asarray(max_new_tokens), (batch,)) if np.ndim(max_new_tokens) == 0 \
        else np.asarray(max_new_tokens)
    if limits.shape != (batch,) or limits.dtype.kind not in "iu":
        raise ValueError(f"max_new_tokens must be an int or a list of {batch} ints")
    if limits.min() < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {limits.min()}")
    return limits.astype(np.int32)


def _prefill(params, cfg: ModelConfig, tokens, lengths, cache: KVCache, sampling, key):
    """Run the padded prompts; sample the first new token from each row's last real position."""
    x, _, cache = forward_hidden(params, tokens, cache, cfg)
    cache = rollback(cache, lengths)
    last = jnp.take_along_axis(x, (lengths - 1)[:, None, None], axis=1)[:, 0]  # [B, E]
    return sample_tokens(key, lm_head(params, last), sampling), cache


def _autoregressive(params, tokens, lengths, limits, cache, sampling, eos_ids, key, *, cfg, capacity_out):
    """Prefill + lax.while_loop of one-token steps. -> (out int32[B, N], count int32[B], steps, cache)."""
    TRACES["autoregressive"] += 1
    B = tokens.shape[0]
    key, sub = jax.random.split(key)
    first, cache = _prefill(params, cfg, tokens, lengths, cache, sampling, sub)
    out = jnp.full((B, capacity_out), -1, jnp.int32).at[:, 0].set(first)
    count = jnp.ones((B,), jnp.int32)
    done = jnp.isin(first, eos_ids) | (count >= limits)

    def cond(state):
        return ~jnp.all(state[4])

    def body(state):
        cache, last, out, count, done, key, steps = state
        key, sub = jax.random.split(key)
        logits, _, cache = forward(params, last[:, None], cache, cfg)
        tok = sample_tokens(sub, logits[:, 0], sampling)
        slot = jnp.where(done, capacity_out, count)                # finished rows write nowhere
        out = out.at[jnp.arange(B), slot].set(tok, mode="drop")
        count = count + (~done).astype(jnp.int32)
        last = jnp.where(done, last, tok)
        done = done | jnp.isin(tok, eos_ids) | (count >= limits)
        return cache, last, out, count, done, key, steps + 1

    state = (cache, first, out, count, done, key, jnp.zeros((), jnp.int32))
    cache, _, out, count, _, _, steps = jax.lax.while_loop(cond, body, state)
    return out, count, steps, cache  # returning the cache lets XLA reuse the donated buffers


def _compiled(name, fn, static: dict, args: tuple, donate: tuple):
    """AOT-compile fn for these argument shapes once; -> (executable, seconds spent compiling now)."""
    shapes = tuple((a.shape, a.dtype) for a in jax.tree_util.tree_leaves(args))
    key = (name, tuple(sorted(static.items())), shapes)
    if key in _COMPILED:
        return _COMPILED[key], 0.0
    start = time.perf_counter()
    jitted = jax.jit(functools.partial(fn, **static), donate_argnums=donate)
    exe = jitted.lower(*args).compile()
    _COMPILED[key] = exe
    return exe, time.perf_counter() - start


def generate(model, prompts, max_new_tokens: Union[int, Sequence[int]] = 128,
             sampling: SamplingArg = Sampling(), drafter=None, num_draft_tokens: int = 5,
             seed: int = 0, max_cache_len: Optional[int] = None) -> GenerateOutput:
    """Generate up to max_new_tokens per prompt (token-id lists) with the target `model`.

    drafter=None is plain autoregressive decoding. Returns tokens, texts and stats.
    """
    cfg: ModelConfig = model.config
    if drafter is not None:
        raise NotImplementedError("speculative decoding (drafter=...) is not built yet")
    rows = _check_prompts(prompts, cfg.vocab_size)
    B = len(rows)
    limits = _check_limits(max_new_tokens, B)
    params_s = row_params(sampling, B)
    limit_len = cfg.max_position_embeddings if max_cache_len is None else int(max_cache_len)
    for i, r in enumerate(rows):
        if len(r) + int(limits[i]) > limit_len:
            raise ValueError(f"prompt {i} ({len(r)} tokens) + max_new_tokens ({int(limits[i])}) exceeds "
                             f"the cache capacity of {limit_len} tokens")
    eos = getattr(model.tokenizer, "eos_token_ids", ()) or ()
    eos_ids = jnp.asarray(list(eos) or [-1], jnp.int32)

    T = bucket(max(len(r) for r in rows))
    N = bucket(int(limits.max()))
    tokens = np.zeros((B, T), np.int32)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
    lengths = jnp.asarray([len(r) for r in rows], jnp.int32)
    cache = init_cache(cfg, B, T + N, model.params["embed"].dtype)
    key = jax.random.PRNGKey(seed)
    args = (model.params, jnp.asarray(tokens), lengths, jnp.asarray(limits), cache, params_s, eos_ids, key)
    exe, compile_s = _compiled("autoregressive", _autoregressive, {"cfg": cfg, "capacity_out": N}, args,
                               donate=(4,))
    start = time.perf_counter()
    out, count, steps, _ = exe(*args)
    out, count = np.asarray(out), np.asarray(count)
    wall = time.perf_counter() - start

    new = [out[i, :count[i]].tolist() for i in range(B)]
    total = int(count.sum())
    stats = Stats(wall_seconds=wall, tokens_per_second=total / wall if wall > 0 else float("nan"),
                  compile_seconds=compile_s, new_tokens=total, target_steps=int(steps))
    texts = [model.tokenizer.decode(t) for t in new] if model.tokenizer is not None else [""] * B
    return GenerateOutput(tokens=new, texts=texts, stats=stats)
