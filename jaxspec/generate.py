"""Generation: per shape bucket, a compiled prefill program, then one compiled lax.while_loop.

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
from .drafters.base import Context, Drafter
from .rejection import rejection_sample
from . import policy
from .sampling import Sampling, SamplingArg, probs_from_logits, row_params, sample_tokens

TRACES: collections.Counter = collections.Counter()  # program name -> times traced (compile guard)
# Compiled programs (prefills and loops), least recently used first. Bounded: XLA CPU maps ~1,500 memory
# regions per program of a 30-layer model (one per kernel of the unrolled layers); a process may hold 65,530.
_COMPILED: collections.OrderedDict = collections.OrderedDict()
MAX_PROGRAMS = 24
# From this batch size on, decode steps attend only over the slots in use (models/llama.attend_live).
# XLA CPU, SmolLM2, one-token step over a 640-slot cache with 200 in use: batch 16 131 -> 86 ms,
# batch 64 571 -> 366 ms; at batch 4 it saved 0-8% and cost up to 6%, with few slots left unused.
LIVE_ATTENTION_MIN_BATCH = 8


@dataclasses.dataclass
class Stats:
    wall_seconds: float                    # prefill_seconds + decode_seconds
    tokens_per_second: float               # new_tokens / wall_seconds
    compile_seconds: float
    new_tokens: int
    target_steps: int                      # target forward passes after prefill, summed over the loop
    mean_accepted_length: float = 1.0      # 1 + accepted / steps (counts the bonus token)
    acceptance_rate: Optional[float] = None
    per_position_acceptance: list = dataclasses.field(default_factory=list)  # kept / drafted, per position
    steps_per_k: dict = dataclasses.field(default_factory=dict)  # adaptive: loop steps that used each K
    step_costs: dict = dataclasses.field(default_factory=dict)   # adaptive: K -> measured cost, plain steps
    prefill_seconds: float = 0.0           # the prompts' pass, up to the first token of every row
    decode_seconds: float = 0.0            # the loop after it
    decode_tokens: int = 0                 # the tokens it made: new_tokens less each row's first
    decode_tokens_per_second: float = float("nan")   # decode_tokens / decode_seconds


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


def _prefill(params, tokens, lengths, cache: KVCache, sampling, key, *, cfg: ModelConfig, hidden_layers=()):
    """Run the padded prompts; sample the first new token from each row's last real position. Its
    own program, so that the time to the first token and the decode loop are timed apart.
    -> (first int32[B], cache, hidden [N, B, T, E] of the requested layers, the loop's key)."""
    TRACES["prefill"] += 1
    key, sub = jax.random.split(key)
    x, hidden, cache = forward_hidden(params, tokens, cache, cfg, hidden_layers)
    cache = rollback(cache, lengths)
    last = jnp.take_along_axis(x, (lengths - 1)[:, None, None], axis=1)[:, 0]  # [B, E]
    return sample_tokens(sub, lm_head(params, last), sampling), cache, hidden, key


def _live(cache: KVCache, done: jax.Array, num_tokens, on: bool):
    """The cache slots a step of num_tokens may read (attend_live), or None (all S) when off."""
    return jnp.max(jnp.where(done, 0, cache.length)) + num_tokens if on else None


def _autoregressive(params, first, limits, cache, sampling, eos_ids, key, *, cfg, capacity_out, live_attention):
    """lax.while_loop of one-token steps after _prefill (first int32[B], the cache holding the prompts).
    live_attention (static): attention reads only the slots of the longest unfinished row.
    -> (out int32[B, N], count int32[B], steps, cache)."""
    TRACES["autoregressive"] += 1
    B = first.shape[0]
    out = jnp.full((B, capacity_out), -1, jnp.int32).at[:, 0].set(first)
    count = jnp.ones((B,), jnp.int32)
    done = jnp.isin(first, eos_ids) | (count >= limits)

    def cond(state):
        return ~jnp.all(state[4])

    def body(state):
        cache, last, out, count, done, key, steps = state
        key, sub = jax.random.split(key)
        logits, _, cache = forward(params, last[:, None], cache, cfg, live=_live(cache, done, 1, live_attention))
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


def _emit(buf, start, tokens, count):
    """Write tokens[B, W] at buf[b, start[b] + i] for i < count[b] (other slots dropped)."""
    B, W = tokens.shape
    idx = jnp.arange(W, dtype=jnp.int32)
    slots = jnp.where(idx[None] < count[:, None], start[:, None] + idx[None], buf.shape[1])
    return buf.at[jnp.arange(B)[:, None], slots].set(tokens, mode="drop")


def _greedy_verify(draft, logits):
    """Greedy rows: keep the drafts that equal the target's argmax, then the argmax itself. Same result
    as rejection_sample with one-hot target distributions, without building them ([B, K+1, V])."""
    K = draft.shape[1]
    target = jnp.argmax(logits, axis=-1).astype(jnp.int32)                   # [B, K+1]
    n = jnp.cumprod(draft == target[:, :K], axis=1).sum(1).astype(jnp.int32)
    idx = jnp.arange(K + 1)[None]
    drafts = jnp.concatenate([draft, jnp.zeros_like(draft[:, :1])], axis=1)
    return n, jnp.where(idx < n[:, None], drafts, jnp.where(idx == n[:, None], target, -1))


def _verify(draft, draft_probs, logits, sampling, key):
    """-> (num_accepted int32[B], emitted int32[B, K+1]) by rejection sampling (greedy fast path)."""
    def sampled():
        return rejection_sample(draft, draft_probs, probs_from_logits(logits, sampling), key)
    return jax.lax.cond(jnp.all(sampling["temperature"] == 0), lambda: _greedy_verify(draft, logits), sampled)


def _spec_step(params, dparams, cache, dstate, ctx: Context, key, live=None, *, cfg, drafter, num_draft, width):
    """One step with K = num_draft drafts, or K = 0: a plain target step while the drafter syncs.
    live: the cache slots the target pass reads (None: all; see _live).

    -> (num_accepted int32[B], emitted int32[B, width] (-1 past the step's K+1), target cache with
    length += K+1, drafter state, hidden [N, B, width, E] of the pass, zero-padded)."""
    K = num_draft
    k_draft, k_accept = jax.random.split(key)
    if K == 0:
        dstate = drafter.sync(dparams, dstate, ctx)
        logits, hidden, cache = forward(params, ctx.last[:, None], cache, cfg, drafter.hidden_layers, live)
        n, emitted = jnp.zeros_like(ctx.last), sample_tokens(k_accept, logits, ctx.sampling)
    else:
        draft, draft_probs, dstate = drafter.propose(dparams, dstate, ctx, k_draft, K)
        verify = jnp.concatenate([ctx.last[:, None], draft], axis=1)              # [B, K+1]
        logits, hidden, cache = forward(params, verify, cache, cfg, drafter.hidden_layers, live)
        n, emitted = _verify(draft, draft_probs, logits, ctx.sampling, k_accept)
    pad = width - (K + 1)
    emitted = jnp.pad(emitted, ((0, 0), (0, pad)), constant_values=-1)
    hidden = jnp.pad(hidden, ((0, 0), (0, 0), (0, pad), (0, 0)))
    return n, emitted, cache, dstate, hidden


def _speculative(params, dparams, tokens, lengths, limits, cache, sampling, eos_ids, key, first, prompt_features,
                 costs, prior, *, cfg, drafter, ks, capacity_out, live_attention):
    """After _prefill (first int32[B], prompt_features [N, B, T, E]), steps: propose K -> one target
    pass over K+1 -> rejection -> rollback.

    ks: the K values of this loop (static). One value: fixed K, one lax.while_loop. Several
    (adaptive): policy.choose picks each step's K from the acceptance estimates (starting at prior
    float32[C], one per drafter context) and costs float32[len(ks)] (plain steps), at the end of
    the step before. An outer loop runs one inner while_loop per K in turn, each running steps while
    the choice is its K: a lax.switch around every step cost 4-7% of a plain step on XLA CPU, and a
    switch between the inner loops made XLA copy the KV cache on each entry into a K > 0 loop.
    -> (out int32[B, N+K+1], count int32[B], steps, accept stats, cache). The loop keeps one token
    buffer, `history` (prompt + output per row); the output is cut from it at the end."""
    TRACES["speculative"] += 1
    B, T = tokens.shape
    K = max(ks)
    P = K + 1                          # width of a step's emitted tokens and features
    width = capacity_out + P
    adaptive = len(ks) > 1
    history = jnp.zeros((B, cache.capacity + P), jnp.int32).at[:, :T].set(tokens)
    history = history.at[jnp.arange(B), lengths].set(first)
    count = jnp.ones((B,), jnp.int32)
    zero = jnp.zeros((), jnp.int32)
    acc = {"steps": zero, "accepted": zero, "drafted": zero, "per_position": jnp.zeros((K,), jnp.int32),
           "drafted_per_position": jnp.zeros((K,), jnp.int32), "k_steps": jnp.zeros((len(ks),), jnp.int32)}
    # the features of the pass that made `first` (the prompt's last position) wait at index 0
    features = jnp.zeros((len(drafter.hidden_layers), B, P, cfg.hidden_size), params["embed"].dtype)
    last_pos = jnp.take_along_axis(prompt_features, (lengths - 1)[None, :, None, None], axis=2)
    features = features.at[:, :, :1].set(last_pos.astype(features.dtype))

    def context_of(s):
        return Context(s["last"], s["history"], s["cache"].length + 1, sampling, s["features"])

    def choose(s):
        """The next step's drafter context int32[B] and index into ks."""
        if not adaptive:
            return jnp.zeros((B,), jnp.int32), zero
        context = drafter.context(dparams, s["dstate"], context_of(s))
        return context, policy.choose(s["est"], ks, costs, context, ~s["done"])

    def step(choice: int, s):
        """One step with K = ks[choice] (static)."""
        k_now, last, done, count = ks[choice], s["last"], s["done"], s["count"]
        key, k_step = jax.random.split(s["key"])
        ctx = context_of(s)
        n, emitted, new_cache, dstate, hidden = _spec_step(params, dparams, s["cache"], s["dstate"], ctx, k_step,
                                                           _live(s["cache"], done, k_now + 1, live_attention),
                                                           cfg=cfg, drafter=drafter, num_draft=k_now, width=P)
        idx = jnp.arange(P, dtype=jnp.int32)
        eos_at = jnp.isin(emitted, eos_ids) & (idx[None] <= n[:, None])
        upto_eos = jnp.where(eos_at.any(1), jnp.argmax(eos_at, axis=1) + 1, P)
        emit = jnp.minimum(jnp.minimum(n + 1, upto_eos), limits - count)
        emit = jnp.where(done, 0, emit)
        active = ~done
        drafted = active[:, None] & (idx[None, :K] < k_now)
        a = s["acc"]
        acc = {"steps": a["steps"] + active.sum(),
               "accepted": a["accepted"] + jnp.where(active, n, 0).sum(),
               "drafted": a["drafted"] + active.sum() * k_now,
               "per_position": a["per_position"] + (active[:, None] & (idx[None, :K] < n[:, None])).sum(0),
               "drafted_per_position": a["drafted_per_position"] + drafted.sum(0),
               "k_steps": a["k_steps"].at[choice].add(1)}
        new = {"cache": rollback(new_cache, jnp.where(done, s["cache"].length, s["cache"].length + n + 1)),
               "dstate": drafter.commit(dparams, dstate, ctx, jnp.where(done, 0, n)),
               "last": jnp.where(done, last, emitted[jnp.arange(B), n]),
               "history": _emit(s["history"], ctx.history_len, emitted, emit),
               "count": count + emit,
               "done": done | (eos_at.any(1) & (upto_eos <= emit)) | (count + emit >= limits),
               "key": key, "steps": s["steps"] + 1, "acc": acc, "features": hidden,
               "est": policy.update(s["est"], jnp.int32(k_now), n, active, s["context"]) if adaptive else s["est"]}
        new["context"], new["choice"] = choose(new)
        return new

    def run_while_chosen(choice: int):
        return lambda s: jax.lax.while_loop(lambda s: ~jnp.all(s["done"]) & (s["choice"] == choice),
                                            functools.partial(step, choice), s)

    est = policy.init_estimate(prior)
    state = {"cache": cache, "last": first, "history": history, "count": count,
             "done": jnp.isin(first, eos_ids) | (count >= limits),
             "dstate": drafter.init(dparams, tokens, lengths, cache.capacity, prompt_features),
             "key": key, "steps": zero, "acc": acc, "features": features, "est": est}
    state["context"], state["choice"] = choose(state)
    if adaptive:
        def each_k_in_turn(s):
            for i in range(len(ks)):
                s = run_while_chosen(i)(s)
            return s
        state = jax.lax.while_loop(lambda s: ~jnp.all(s["done"]), each_k_in_turn, state)
    else:
        state = run_while_chosen(0)(state)
    cols = lengths[:, None] + jnp.arange(width, dtype=jnp.int32)[None]
    out = jnp.take_along_axis(state["history"], jnp.minimum(cols, state["history"].shape[1] - 1), axis=1)
    out = jnp.where(jnp.arange(width)[None] < state["count"][:, None], out, -1)
    return out, state["count"], state["steps"], state["acc"], state["cache"]


def _compiled(tag: tuple, fn, static: dict, args: tuple, donate: tuple):
    """AOT-compile fn for these argument shapes once; -> (executable, seconds spent compiling now).

    tag names everything static that changes the program (hashable); static are fn's keyword args."""
    shapes = tuple((a.shape, a.dtype) for a in jax.tree_util.tree_leaves(args))
    key = (tag, shapes)
    if key in _COMPILED:
        _COMPILED.move_to_end(key)
        return _COMPILED[key], 0.0
    start = time.perf_counter()
    jitted = jax.jit(functools.partial(fn, **static), donate_argnums=donate)
    exe = jitted.lower(*args).compile()
    _COMPILED[key] = exe
    while len(_COMPILED) > MAX_PROGRAMS:
        _COMPILED.popitem(last=False)
    return exe, time.perf_counter() - start


def _check_drafter(drafter, num_draft_tokens, model) -> int:
    if not isinstance(drafter, Drafter):
        raise ValueError(f"drafter must be a jaxspec.drafters drafter or None, got {type(drafter).__name__}")
    if isinstance(num_draft_tokens, bool) or int(num_draft_tokens) != num_draft_tokens or num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens (K) must be an integer >= 1, got {num_draft_tokens}")
    drafter.check_target(model)
    return int(num_draft_tokens)


def padded_batch(model, rows: list, max_new_tokens: int, extra: int):
    """Prompts right-padded to a length bucket T, and an empty cache of T + N + extra slots (N: the
    output bucket) -> (tokens int32[B, T] (numpy), lengths int32[B], cache, N)."""
    T, N = bucket(max(len(r) for r in rows)), bucket(max_new_tokens)
    tokens = np.zeros((len(rows), T), np.int32)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
    lengths = jnp.asarray([len(r) for r in rows], jnp.int32)
    return tokens, lengths, init_cache(model.config, len(rows), T + N + extra, model.params["embed"].dtype), N


def _step_costs(model, drafter, ks, tokens, lengths, cache, sampling, live_attention: bool = False) -> dict:
    """policy.measure_costs for this model, drafter and batch size: one step with each K in ks against
    a plain target step, on a cache filled to the prompt lengths (measured at the first cache size
    seen; the ratios move little with it)."""
    cfg, params = model.config, model.params
    B, P = tokens.shape[0], max(ks) + 1

    def make_args():                                    # only when this key has not been measured yet
        dparams = drafter.params_for(model)
        features = jnp.zeros((len(drafter.hidden_layers), B, tokens.shape[1], cfg.hidden_size),
                             params["embed"].dtype)
        dstate = drafter.init(dparams, jnp.asarray(tokens), lengths, cache.capacity, features)
        dstate = jax.tree_util.tree_map(jnp.copy, dstate)   # the timing donates it: no buffer shared with the caller
        history = jnp.zeros((B, cache.capacity + P), jnp.int32).at[:, :tokens.shape[1]].set(tokens)
        ctx = Context(history[jnp.arange(B), lengths - 1], history, lengths + 1, sampling,
                      jnp.zeros(features.shape[:2] + (P, cfg.hidden_size), features.dtype))
        timed_cache = jax.tree_util.tree_map(jnp.copy, rollback(cache, lengths))   # a copy: the timing donates it
        return params, dparams, timed_cache, dstate, ctx, jax.random.PRNGKey(0)

    # Every output is returned, caches and drafter state included: XLA drops work whose result is
    # unused, which removed the drafter's sync from K = 0 steps and the cache writes from all. The
    # cache and the drafter state (arguments 2 and 3) are donated and passed on; each call first rolls
    # the cache back to the prompts.
    def plain(params, dparams, cache, dstate, ctx, key):
        cache = rollback(cache, ctx.history_len - 1)
        live = _live(cache, jnp.zeros((B,), bool), 1, live_attention)
        logits, _, cache = forward(params, ctx.last[:, None], cache, cfg, live=live)
        return (cache, dstate), sample_tokens(key, logits, ctx.sampling)

    def spec(k):
        step = functools.partial(_spec_step, cfg=cfg, drafter=drafter, num_draft=k, width=P)

        def timed(params, dparams, cache, dstate, ctx, key):
            cache = rollback(cache, ctx.history_len - 1)
            live = _live(cache, jnp.zeros((B,), bool), k + 1, live_attention)
            n, emitted, cache, dstate, hidden = step(params, dparams, cache, dstate, ctx, key, live)
            return (cache, dstate), (n, emitted, hidden)
        return timed

    greedy = bool(np.all(np.asarray(sampling["temperature"]) == 0))
    key = (cfg, drafter.static_key(), ks, B, greedy, live_attention)   # one measurement serves every cache size
    return policy.measure_costs(key, plain, spec, make_args, ks)


def generate(model, prompts, max_new_tokens: Union[int, Sequence[int]] = 128,
             sampling: SamplingArg = Sampling(), drafter: Optional[Drafter] = None, num_draft_tokens: int = 5,
             seed: int = 0, max_cache_len: Optional[int] = None, adaptive: bool = True) -> GenerateOutput:
    """Generate up to max_new_tokens per prompt (token-id lists) with the target `model`.

    drafter=None is plain autoregressive decoding; with a drafter every step proposes up to
    num_draft_tokens (K) tokens that one target pass verifies (lossless rejection sampling).
    adaptive=True (jaxspec/policy.py) picks each step's K in policy.candidates(K), 0 (a plain step)
    included, from running acceptance estimates and step costs measured on first use for this
    batch size; when neither the drafter's prior acceptance makes some K pay nor waiting at K = 0 is
    about as cheap as a plain step (policy.speculation_can_pay), it decodes plainly. adaptive=False: K fixed.
    Returns tokens, texts and stats.
    """
    cfg: ModelConfig = model.config
    K = _check_drafter(drafter, num_draft_tokens, model) if drafter is not None else 0
    rows = _check_prompts(prompts, cfg.vocab_size)
    B = len(rows)
    limits = _check_limits(max_new_tokens, B)
    params_s = row_params(sampling, B)
    limit_len = cfg.max_position_embeddings if max_cache_len is None else int(max_cache_len)
    extra = K + 1 if drafter is not None else 0
    for i, r in enumerate(rows):
        if len(r) + int(limits[i]) + extra > limit_len:
            raise ValueError(f"prompt {i} ({len(r)} tokens) + max_new_tokens ({int(limits[i])})"
                             + (f" + K+1 ({extra})" if extra else "")
                             + f" exceeds the cache capacity of {limit_len} tokens")
    eos = getattr(model.tokenizer, "eos_token_ids", ()) or ()
    eos_ids = jnp.asarray(list(eos) or [-1], jnp.int32)

    tokens, lengths, cache, N = padded_batch(model, rows, int(limits.max()), extra)
    tokens, limits, key = jnp.asarray(tokens), jnp.asarray(limits), jax.random.PRNGKey(seed)
    live_attention = B >= LIVE_ATTENTION_MIN_BATCH
    ks = (policy.candidates(K) if adaptive else (K,)) if drafter is not None else ()
    costs, cost_s = np.ones((len(ks),), np.float32), 0.0
    if drafter is not None and adaptive:
        measured = _step_costs(model, drafter, ks, tokens, lengths, cache, params_s, live_attention)
        costs, cost_s = measured["costs"], measured["seconds"]
        if not policy.speculation_can_pay(ks, costs, drafter.prior_acceptance, measured["errors"]):
            drafter = None                                      # plain decoding: speculation is not expected to win
    hidden_layers = drafter.hidden_layers if drafter is not None else ()
    args = (model.params, tokens, lengths, cache, params_s, key)
    prefill, compile_s = _compiled(("prefill", cfg, hidden_layers), _prefill,
                                   {"cfg": cfg, "hidden_layers": hidden_layers}, args, donate=(3,))
    start = time.perf_counter()
    first, cache, features, key = prefill(*args)
    first.block_until_ready()
    prefill_s = time.perf_counter() - start
    if drafter is None:
        args = (model.params, first, limits, cache, params_s, eos_ids, key)
        loop, loop_compile_s = _compiled(("autoregressive", cfg, N, live_attention), _autoregressive,
                                         {"cfg": cfg, "capacity_out": N, "live_attention": live_attention},
                                         args, donate=(3,))
    else:
        args = (model.params, drafter.params_for(model), tokens, lengths, limits, cache, params_s, eos_ids, key,
                first, features, jnp.asarray(costs), jnp.asarray(drafter.prior_acceptance, jnp.float32))
        loop, loop_compile_s = _compiled(("speculative", cfg, drafter.static_key(), ks, N, live_attention),
                                         _speculative, {"cfg": cfg, "drafter": drafter, "ks": ks, "capacity_out": N,
                                                        "live_attention": live_attention},
                                         args, donate=(5,))
    start = time.perf_counter()
    result = loop(*args)
    out, count = np.asarray(result[0]), np.asarray(result[1])
    decode_s = time.perf_counter() - start
    wall = prefill_s + decode_s

    new = [out[i, :count[i]].tolist() for i in range(B)]
    total = int(count.sum())
    stats = Stats(wall_seconds=wall, tokens_per_second=total / wall if wall > 0 else float("nan"),
                  compile_seconds=compile_s + loop_compile_s + cost_s, new_tokens=total, target_steps=int(result[2]),
                  prefill_seconds=prefill_s, decode_seconds=decode_s, decode_tokens=total - B,
                  decode_tokens_per_second=(total - B) / decode_s if decode_s > 0 else float("nan"))
    if adaptive and ks:
        stats.step_costs = {k: float(c) for k, c in zip(ks, costs)}
        stats.steps_per_k = {0: int(result[2])}
    if drafter is not None:
        acc = jax.tree_util.tree_map(np.asarray, result[3])
        row_steps = max(int(acc["steps"]), 1)
        stats.mean_accepted_length = 1.0 + int(acc["accepted"]) / row_steps
        stats.acceptance_rate = int(acc["accepted"]) / max(int(acc["drafted"]), 1)
        stats.per_position_acceptance = (acc["per_position"] / np.maximum(acc["drafted_per_position"], 1)).tolist()
        if adaptive:
            stats.steps_per_k = {k: int(c) for k, c in zip(ks, acc["k_steps"])}
    texts = [model.tokenizer.decode(t) for t in new] if model.tokenizer is not None else [""] * B
    return GenerateOutput(tokens=new, texts=texts, stats=stats)
